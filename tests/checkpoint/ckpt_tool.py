#!/usr/bin/env python3
"""What the checkpoint tests (tests/checkpoint/*.sh) check outside the programs they run.

  ckpt_tool.py compare REF GOT FIRST LAST exact|TOL
      GOT's --metrics steps are exactly FIRST..LAST, and their "loss" and "grad_norm" match REF's
      for those steps: as the same text (exact: the same floats, as train_gpt prints %.9g) or
      within TOL relative; REF's loss must move over them (equal flat curves prove nothing).
  ckpt_tool.py committed DIR STEP
      DIR/latest names step-STEP (8 digits), whose metadata.json parses, says that step and lists
      data files that exist with the sizes it records, every chunk inside one of them.
  ckpt_tool.py corrupt GOOD OUT CASES
      Damaged copies of the checkpoint directory GOOD (one step-N folder and `latest`) below OUT,
      one per way a checkpoint goes bad, and CASES: one line per copy, tab-separated: its name,
      the path to load, and the texts the refusal must hold (prog_ckpt_bad check reads it).
"""
import json
import os
import re
import shutil
import sys


def fail(msg):
    sys.exit(f"ckpt_tool: {msg}")


# ---- compare ----------------------------------------------------------------------------------

def step_rows(path):
    """{step: raw line} of the training steps of a metrics file (evaluations have no "loss")."""
    if not os.path.exists(path):
        fail(f"no metrics file {path} (the run failed before writing it?)")
    rows = {}
    for line in open(path):
        if not line.strip():
            continue
        row = json.loads(line)
        if "loss" in row:
            if row["step"] in rows:
                fail(f"{path}: step {row['step']} appears twice")
            rows[row["step"]] = line
    return rows


def raw_field(line, key):
    """A field's text as written (json.loads would hide a difference in the last digit)."""
    m = re.search(r'"%s": ([^,}]+)' % key, line)
    if not m:
        fail(f"no {key} in {line!r}")
    return m.group(1)


def compare(ref_path, got_path, first, last, mode):
    ref, got = step_rows(ref_path), step_rows(got_path)
    want = list(range(int(first), int(last) + 1))
    if sorted(got) != want:
        fail(f"{got_path}: steps {sorted(got)}, expected {want}")
    if any(s not in ref for s in want):
        fail(f"{ref_path}: steps {sorted(ref)} lack some of {want}")
    worst = 0.0
    for s in want:
        for key in ("loss", "grad_norm", "lr"):
            a, b = raw_field(ref[s], key), raw_field(got[s], key)
            if mode == "exact" or key == "lr":  # the schedule continues exactly on any layout
                if a != b:
                    fail(f"step {s} {key}: {b} against {a} (expected the same bits)")
                continue
            x, y = float(a), float(b)
            rel = abs(x - y) / max(abs(x), 1e-30)
            worst = max(worst, rel)
            if rel > float(mode):
                fail(f"step {s} {key}: {y!r} against {x!r}: relative {rel:.2e} > {mode}")
    losses = [float(raw_field(ref[s], "loss")) for s in want]
    if len(set(losses)) < len(losses):
        fail(f"{ref_path}: the reference losses repeat ({losses}): the comparison shows nothing")
    how = "identical" if mode == "exact" else f"worst relative difference {worst:.2e} <= {mode}"
    print(f"steps {first}-{last} of {got_path} against {ref_path}: {how}")


# ---- committed --------------------------------------------------------------------------------

def committed(root, step):
    name = "step-%08d" % int(step)
    latest = open(os.path.join(root, "latest")).read().strip()
    if latest != name:
        fail(f"{root}/latest names {latest!r}, expected {name!r}")
    folder = os.path.join(root, name)
    meta = json.load(open(os.path.join(folder, "metadata.json")))
    if meta.get("format") != "meshtrain-checkpoint" or meta.get("step") != int(step):
        fail(f"{folder}/metadata.json: format {meta.get('format')!r}, step {meta.get('step')!r}")
    for f, info in meta["files"].items():
        size = os.path.getsize(os.path.join(folder, f))
        if size != info["bytes"]:
            fail(f"{folder}/{f}: {size} bytes, metadata.json says {info['bytes']}")
    if not meta["tensors"]:
        fail(f"{folder}/metadata.json lists no tensors")
    for t, info in meta["tensors"].items():
        for c in info["chunks"]:
            if c["offset"] + c["bytes"] > meta["files"][c["file"]]["bytes"]:
                fail(f"{folder}: a chunk of {t} lies outside {c['file']}")
    print(f"{root}/latest names {name}: metadata.json parses, {len(meta['files'])} data files "
          f"complete, {len(meta['tensors'])} tensors")


# ---- corrupt ----------------------------------------------------------------------------------

def corrupt(good, out, cases_path):
    step = open(os.path.join(good, "latest")).read().strip()
    meta_text = open(os.path.join(good, step, "metadata.json")).read()
    cases = []

    def copy(name):
        d = os.path.join(out, name)
        shutil.copytree(good, d)
        return d, os.path.join(d, step)

    def edit_meta(name, change, *want, load_folder=False):
        d, folder = copy(name)
        meta = json.loads(meta_text)
        change(meta)
        path = os.path.join(folder, "metadata.json")
        with open(path, "w") as f:
            json.dump(meta, f)
        cases.append((name, folder if load_folder else d) + tuple(w.format(meta=path, dir=folder)
                                                                  for w in want))

    def drop(m, t):
        del m["tensors"][t]

    edit_meta("missing_tensor", lambda m: drop(m, "model/block1.mlp.fc.weight"),
              "{dir}", "has no tensor 'model/block1.mlp.fc.weight', which the model has")

    def extra(m):
        m["tensors"]["model/block9.attn.qkv.weight"] = m["tensors"]["model/block0.attn.qkv.weight"]
    edit_meta("extra_tensor", extra,
              "{dir}", "has tensor 'model/block9.attn.qkv.weight', which the model does not have")

    # The same elements in another shape: consistent metadata (every chunk gets the new
    # dimension too), refused against the model.
    def reshape(m):
        t = m["tensors"]["model/ln_f.weight"]
        t["shape"] = t["shape"] + [1]
        for c in t["chunks"]:
            c["offsets"] = c["offsets"] + [0]
            c["extents"] = c["extents"] + [1]
    edit_meta("shape", reshape, "{dir}",
              "tensor 'model/ln_f.weight' has shape [32, 1] in the checkpoint and [32] in the "
              "model", load_folder=True)

    # A shape its chunks do not fill: the metadata contradicts itself.
    def grow(m):
        m["tensors"]["model/wpe.weight"]["shape"][0] += 1
    edit_meta("shape_vs_chunks", grow, "{meta}", "tensor 'model/wpe.weight'",
              "its chunks hold 512 elements, its shape 544")

    def bf16(m):
        m["tensors"]["model/wte.weight"]["dtype"] = "bf16"
    edit_meta("dtype", bf16, "{meta}", "tensor 'model/wte.weight'",
              "dtype 'bf16' is not supported")

    def newer(m):
        m["version"] = 99
    edit_meta("version", newer, "{meta}", "format version 99",
              "newer than this build reads (1)")

    def no_extra(m):
        del m["extras"]["config"]
    edit_meta("missing_extra", no_extra, "{dir}", "has no extra state 'config'")

    d, folder = copy("truncated")
    data = os.path.join(folder, "rank-00001.bin")
    size = os.path.getsize(data)
    os.truncate(data, size - 100)
    cases.append(("truncated", d, f"data file '{data}' has {size - 100} bytes, its metadata "
                  f"says {size} (truncated)", "reading "))

    # One byte in the middle of the largest chunk of rank 0's file: its checksum names it.
    meta = json.loads(meta_text)
    tensor, chunk = max(((t, c) for t, info in meta["tensors"].items() for c in info["chunks"]
                         if c["file"] == "rank-00000.bin"), key=lambda tc: tc[1]["bytes"])
    d, folder = copy("flipped_byte")
    data = os.path.join(folder, "rank-00000.bin")
    with open(data, "r+b") as f:
        f.seek(chunk["offset"] + chunk["bytes"] // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    cases.append(("flipped_byte", d, f"checksum mismatch in data file '{data}' for tensor "
                  f"'{tensor}'"))

    d, folder = copy("missing_file")
    data = os.path.join(folder, "rank-00001.bin")
    os.remove(data)
    cases.append(("missing_file", d, f"cannot open data file '{data}'"))

    d, folder = copy("not_json")
    path = os.path.join(folder, "metadata.json")
    with open(path, "w") as f:
        f.write(meta_text[: len(meta_text) // 2])  # cut short, as a torn write would leave it
    cases.append(("not_json", d, f"checkpoint '{path}': not valid JSON at line"))

    d, folder = copy("latest_missing")
    with open(os.path.join(d, "latest"), "w") as f:
        f.write("step-00000099\n")
    cases.append(("latest_missing", d, f"'{d}/latest' names '{d}/step-00000099', which has no "
                  "metadata.json"))

    with open(cases_path, "w") as f:
        for c in cases:
            if any("\t" in x or "\n" in x for x in c):
                fail(f"case {c[0]}: a tab or newline in {c}")
            f.write("\t".join(c) + "\n")
    print(f"{len(cases)} damaged copies of {good} in {out}: {', '.join(c[0] for c in cases)}")


def main(argv):
    cmds = {"compare": (compare, 5), "committed": (committed, 2), "corrupt": (corrupt, 3)}
    if len(argv) < 2 or argv[1] not in cmds or len(argv) - 2 != cmds[argv[1]][1]:
        fail(__doc__)
    cmds[argv[1]][0](*argv[2:])


if __name__ == "__main__":
    main(sys.argv)
