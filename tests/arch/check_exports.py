#!/usr/bin/env python3
"""Checks that libmeshtrain.so exports exactly the functions its public headers declare.

The library is built with hidden visibility and marks its public API with MT_API; this check is
what keeps the two from drifting: a public function someone forgot to mark is not exported (a
user's program would fail to link), and an internal function marked by mistake leaks into the
ABI. Declarations are read from the headers as text (comments, preprocessor lines and the
C++ `extern "C"` guards removed); exports from `nm -D --defined-only`.

Usage: check_exports.py LIBRARY INCLUDE_DIR    (INCLUDE_DIR holds meshtrain/*.h)
       check_exports.py --self-test            (a planted drift is reported: the check can fail)
"""
import os
import re
import subprocess
import sys
import tempfile

# Symbols every shared object defines, not part of anyone's API.
LINKER_SYMBOLS = {'_init', '_fini', '_edata', '_end', '__bss_start'}
IDENT = re.compile(r'[A-Za-z_]\w*')


def strip_header(text):
    text = re.sub(r'/\*.*?\*/', ' ', text, flags=re.S)
    text = re.sub(r'//[^\n]*', ' ', text)
    text = re.sub(r'#\s*ifdef\s+__cplusplus.*?#\s*endif', ' ', text, flags=re.S)
    text = re.sub(r'^\s*#(?:[^\n]*\\\n)*[^\n]*', ' ', text, flags=re.M)
    text = re.sub(r'__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)', ' ', text)
    return text


def declarations(text):
    """Names of the functions and extern variables declared (not defined inline) at file scope,
    of the functions defined there (static inline), and of the declarations without MT_API."""
    declared, inline, unmarked = set(), set(), set()
    depth, stmt = 0, []
    i = 0
    while i < len(text):
        c = text[i]
        if c == '{':
            head = ''.join(stmt).strip()
            if depth == 0 and head.endswith(')') and not head.startswith('typedef'):
                # a function body at file scope: skip it whole
                name = function_name(head)
                if name:
                    inline.add(name)
                body = 1
                i += 1
                while i < len(text) and body:
                    body += {'{': 1, '}': -1}.get(text[i], 0)
                    i += 1
                stmt = []
                continue
            depth += 1
        elif c == '}':
            depth -= 1
        elif c == ';' and depth == 0:
            head = ' '.join(''.join(stmt).split())
            stmt = []
            i += 1
            if not head or head.startswith('typedef'):
                continue
            name = function_name(head)
            if not name and head.startswith('extern '):
                name = IDENT.findall(head)[-1]
            if name:
                declared.add(name)
                if 'MT_API' not in IDENT.findall(head):
                    unmarked.add(name)
            continue
        stmt.append(c)
        i += 1
    return declared, inline, unmarked


def function_name(head):
    """The declared function's name in "ret name(args)", or None for anything else."""
    if head.startswith(('struct ', 'enum ', 'union ')) and '(' not in head:
        return None
    paren = head.find('(')
    if paren <= 0:
        return None
    before = head[:paren].rstrip()
    names = IDENT.findall(before)
    if not names or before.endswith('*)') or '(' in before:
        return None
    return names[-1] if before.endswith(names[-1]) else None


def header_api(include_dir):
    declared, inline, unmarked = set(), set(), set()
    folder = os.path.join(include_dir, 'meshtrain')
    for name in sorted(os.listdir(folder)):
        if name.endswith('.h'):
            with open(os.path.join(folder, name), encoding='utf-8') as f:
                d, s, u = declarations(strip_header(f.read()))
            declared |= d
            inline |= s
            unmarked |= u
    return declared - inline, inline, unmarked - inline


def exported(library):
    out = subprocess.run(['nm', '-D', '--defined-only', library], check=True,
                         capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] not in ('A',):
            names.add(parts[2].split('@')[0])
    return names - LINKER_SYMBOLS


def compare(library, include_dir):
    declared, inline, unmarked = header_api(include_dir)
    exports = exported(library)
    # A public declaration must carry MT_API itself: exported only because its definition was
    # marked would leave the header and the boundary disagreeing.
    missing = sorted((declared - exports) | unmarked)
    leaked = sorted(exports - declared)
    return declared, exports, missing, leaked, inline


def report(library, include_dir):
    declared, exports, missing, leaked, inline = compare(library, include_dir)
    for n in missing:
        print(f'declared in {include_dir}/meshtrain without MT_API, or not exported: {n}')
    for n in leaked:
        print(f'exported but declared in no public header (internal: drop MT_API, or declare '
              f'it in a public header): {n}')
    print(f'{os.path.basename(library)}: {len(exports)} exported symbols, {len(declared)} '
          f'public declarations ({len(inline)} inline functions not counted); '
          f'{len(missing)} missing, {len(leaked)} leaked')
    return 1 if missing or leaked else 0


def self_test():
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, 'inc', 'meshtrain'))
        with open(os.path.join(d, 'inc', 'meshtrain', 'a.h'), 'w') as f:
            f.write('#ifndef A_H\n#define A_H\n#ifdef __cplusplus\nextern "C" {\n#endif\n'
                    'typedef struct mt_x mt_x;\ntypedef int (*mt_cb)(int);\n'
                    '/* mt_commented(void); */\n'
                    'MT_API int mt_public(int a, int (*f)(void));\n'
                    'MT_API const char *\n  mt_two_lines(mt_x *x);\n'
                    'int mt_unmarked(void);\n'
                    'int mt_marked_in_c_only(void);\n'
                    'static inline int mt_inline(int v) { return v + 1; }\n'
                    'typedef struct mt_opts { int (*fn)(int); } mt_opts;\n'
                    '#ifdef __cplusplus\n}\n#endif\n#endif\n')
        src = os.path.join(d, 'lib.c')
        with open(src, 'w') as f:
            f.write('#define MT_API __attribute__((visibility("default")))\n'
                    'MT_API int mt_public(int a, int (*f)(void)) { return a; }\n'
                    'MT_API const char *mt_two_lines(void *x) { return 0; }\n'
                    'int mt_unmarked(void) { return 0; }\n'
                    'MT_API int mt_marked_in_c_only(void) { return 0; }\n'
                    'MT_API int mt_internal_leak(void) { return 1; }\n')
        lib = os.path.join(d, 'libt.so')
        subprocess.run([os.environ.get('CC', 'cc'), '-shared', '-fPIC', '-fvisibility=hidden',
                        '-o', lib, src], check=True)
        declared, _, missing, leaked, inline = compare(lib, os.path.join(d, 'inc'))
        want = ({'mt_public', 'mt_two_lines', 'mt_unmarked', 'mt_marked_in_c_only'},
                ['mt_marked_in_c_only', 'mt_unmarked'], ['mt_internal_leak'], {'mt_inline'})
        got = (declared, missing, leaked, inline)
        if got != want:
            print(f'self-test: expected {want}, got {got}')
            return 1
    print('self-test: unmarked public functions (exported or not) and a marked internal one '
          'are reported')
    return 0


def main():
    if sys.argv[1:] == ['--self-test']:
        return self_test()
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    return report(sys.argv[1], sys.argv[2])


if __name__ == '__main__':
    sys.exit(main())
