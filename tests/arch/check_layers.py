#!/usr/bin/env python3
"""Checks that the library's folders depend on each other in one direction only.

The order is read from docs/architecture.md (the line `<!-- layers: a b c ... -->`), so the page
a newcomer reads and this check cannot drift apart. A file in folder F may include, with quotes,
internal headers of F and of folders listed before F; never of a folder listed after it.
Sub-folders belong to their top folder (core/cuda is core), except that two backends of one
folder (comm/host and comm/nccl) never include each other. Includes are named from the source
root (no "../"), quoted or in angle brackets alike. The folders CMakeLists.txt builds the library
from (MT_MODULES) must be the ones the order names. Programs outside the library (examples/)
include public headers only (<meshtrain/...>), as a user's program would.

What it does not see: calls without an include. The layers below mesh/ reach the runtime object
(mt_runtime, the process context every layer is handed) through its public accessors
(runtime.h) and comm/transport.h's mt_runtime_transport, which mesh/runtime.c defines.

Usage: check_layers.py ROOT      check the tree at ROOT
       check_layers.py --self-test   check that a violation is reported (the check can fail)
"""
import os
import re
import sys
import tempfile

# Quoted includes, and angle-bracket ones (the source root is on the library's include path, so
# <comm/work.h> would reach an internal header as well).
INCLUDE = re.compile(r'^\s*#\s*include\s+["<]([^">]+)[">]', re.M)
MODULES = re.compile(r'set\(MT_MODULES\s+([^)]*)\)')
LAYERS_LINE = re.compile(r'<!--\s*layers:\s*([^>]*?)\s*-->')
SOURCES = ('.c', '.h', '.cu', '.cuh')
# Sibling backends: a file in one never includes the other's headers.
SIBLINGS = {'comm/host': 'comm/nccl', 'comm/nccl': 'comm/host'}
PUBLIC_ONLY = ('examples',)


def read_layers(root):
    path = os.path.join(root, 'docs', 'architecture.md')
    with open(path, encoding='utf-8') as f:
        m = LAYERS_LINE.search(f.read())
    if not m:
        sys.exit(f'{path}: no "<!-- layers: ... -->" line naming the folders in order')
    return m.group(1).split()


def built_folders(root):
    """The top folders whose sources CMakeLists.txt compiles into the library (MT_MODULES)."""
    with open(os.path.join(root, 'CMakeLists.txt'), encoding='utf-8') as f:
        m = MODULES.search(f.read())
    return {d.split('/')[0] for d in m.group(1).split()} if m else set()


def sources_under(root, folder):
    for dirpath, _, names in os.walk(os.path.join(root, folder)):
        for name in sorted(names):
            if name.endswith(SOURCES):
                yield os.path.join(dirpath, name)


def sub_folder(rel):
    parts = rel.split('/')
    return '/'.join(parts[:2]) if len(parts) > 2 else parts[0]


def check(root):
    layers = read_layers(root)
    rank = {name: i for i, name in enumerate(layers)}
    problems = []
    built = built_folders(root)
    if built != set(layers):
        problems.append(f'CMakeLists.txt builds the library from {sorted(built)} but '
                        f'docs/architecture.md orders {sorted(layers)}: name every folder once')
    for folder in layers:
        if not os.path.isdir(os.path.join(root, folder)):
            problems.append(f'{folder}/: named in docs/architecture.md but missing')
            continue
        for path in sources_under(root, folder):
            rel = os.path.relpath(path, root)
            with open(path, encoding='utf-8', errors='replace') as f:
                text = f.read()
            for target in INCLUDE.findall(text):
                if target.startswith('../') or '/../' in target:
                    problems.append(f'{rel}: includes "{target}": name headers from the source '
                                    f'root, so that the layer of each is visible')
                    continue
                top = target.split('/')[0]
                if top not in rank:
                    continue  # same-folder short includes, generated headers
                if rank[top] > rank[folder]:
                    problems.append(f'{rel}: includes "{target}": {folder}/ is below {top}/ '
                                    f'({" < ".join(layers)})')
                mine, theirs = sub_folder(rel), sub_folder(target)
                if SIBLINGS.get(mine) == theirs:
                    problems.append(f'{rel}: includes "{target}": the {mine} and {theirs} '
                                    f'backends do not depend on each other')
    for folder in PUBLIC_ONLY:
        for path in sources_under(root, folder):
            rel = os.path.relpath(path, root)
            with open(path, encoding='utf-8', errors='replace') as f:
                for target in INCLUDE.findall(f.read()):
                    if target.split('/')[0] in rank:
                        problems.append(f'{rel}: includes internal "{target}"; {folder}/ uses '
                                        f'the public headers only')
    return layers, problems


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), 'w') as f:
                f.write(text)
        write('docs/architecture.md', '<!-- layers: core comm mesh -->\n')
        write('CMakeLists.txt', 'set(MT_MODULES core comm comm/host comm/nccl mesh)\n')
        write('core/a.c', '#include "core/a.h"\n')
        write('comm/b.c', '#include "core/a.h"\n#include "comm/host/x.h"\n')
        write('comm/host/x.c', '#include "comm/b.h"\n')
        write('comm/nccl/y.c', '#include "comm/b.h"\n')
        write('mesh/c.c', '#include "comm/b.h"\n')
        write('examples/e.c', '#include <meshtrain/mesh.h>\n')
        _, ok = check(root)
        if ok:
            print('self-test: a clean tree was reported:', *ok, sep='\n  ')
            return 1
        write('core/bad.c', '#include "mesh/c.h"\n')
        write('comm/host/bad.c', '#include "comm/nccl/y.h"\n')
        write('comm/bad_angle.c', '#include <mesh/c.h>\n')
        write('comm/bad_relative.c', '#include "../mesh/c.h"\n')
        write('examples/bad.c', '#include "core/a.h"\n')
        write('CMakeLists.txt', 'set(MT_MODULES core comm mesh extra)\n')
        _, found = check(root)
        expected = ['core/bad.c', 'comm/host/bad.c', 'comm/bad_angle.c', 'comm/bad_relative.c',
                    'examples/bad.c', 'CMakeLists.txt']
        missing = [e for e in expected if not any(p.startswith(e) for p in found)]
        if missing or len(found) != len(expected):
            print('self-test: expected violations in', expected, 'got:', *found, sep='\n  ')
            return 1
    print(f'self-test: {len(expected)} planted violations reported, a clean tree passes')
    return 0


def main():
    if sys.argv[1:] == ['--self-test']:
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    layers, problems = check(sys.argv[1])
    for p in problems:
        print(p)
    print(f'layers {" < ".join(layers)}: {len(problems)} violation(s)')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
