#!/usr/bin/env python3
"""Compares meshtrain's topology report with another view of the same machine (tests/gpu/run.sh).

  compare_topo.py smi  NVIDIA_SMI_TOPO_TXT  MT_TOPO_JSON
      the GPU x GPU block of `nvidia-smi topo -m` against `mt-topo --json` (same codes: X, NV#,
      PIX, PXB, PHB, NODE, SYS); the GPU count must match.
  compare_topo.py json REFERENCE_JSON  MT_TOPO_JSON
      two `mt-topo --json` reports, e.g. of NCCL's own dump (NCCL_TOPO_DUMP_FILE, loaded with
      mt-topo --input) against the live one: GPU count, PCI bus ids and the GPU x GPU block.

Prints one line per difference and a summary line; exit 0 when they agree, 1 when they differ,
2 on unreadable input.
"""
import json
import re
import sys

CODE = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS)$")


def parse_smi(text):
    """GPU labels and the GPU x GPU codes of `nvidia-smi topo -m` (tabs or spaces)."""
    lines = [l.rstrip("\n") for l in text.splitlines() if l.strip()]
    header = None
    for i, line in enumerate(lines):
        cols = line.split()
        if cols and re.match(r"^GPU\d+$", cols[0]) and line[0] in " \t":
            header = i
            break
    if header is None:
        raise ValueError("no matrix header (an indented line of column labels GPU0 ...)")
    labels = [c for c in lines[header].split() if re.match(r"^(GPU|NIC)\d+$", c)]
    gpus = [l for l in labels if l.startswith("GPU")]
    rows = {}
    for line in lines[header + 1:]:
        cols = line.split()
        if not cols or not re.match(r"^GPU\d+$", cols[0]):
            if cols and re.match(r"^NIC\d+$", cols[0]):
                continue
            break
        codes = cols[1:1 + len(labels)]
        rows[cols[0]] = {labels[j]: codes[j] for j in range(min(len(codes), len(labels)))}
    return gpus, rows


def matrix_of(report):
    labels = report["matrix"]["labels"]
    rows = report["matrix"]["rows"]
    gpus = [l for l in labels if l.startswith("GPU")]
    out = {}
    for i, label in enumerate(labels):
        if label.startswith("GPU"):
            out[label] = {labels[j]: rows[i][j] for j in range(len(labels))}
    return gpus, out


def compare_blocks(gpus_a, a, gpus_b, b, name_a, name_b):
    diffs = []
    if len(gpus_a) != len(gpus_b):
        diffs.append(f"GPU count: {name_a} {len(gpus_a)}, {name_b} {len(gpus_b)}")
        return diffs
    for g in gpus_a:
        for h in gpus_a:
            x, y = a.get(g, {}).get(h), b.get(g, {}).get(h)
            if x is None or not CODE.match(x):
                diffs.append(f"{g}-{h}: {name_a} has no code ({x!r})")
            elif x != y:
                diffs.append(f"{g}-{h}: {name_a} {x}, {name_b} {y}")
    return diffs


def bus_id(s):
    """0000:1b:00.0 and 00000000:1B:00.0 are the same device."""
    parts = s.lower().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


def main(argv):
    if len(argv) != 4 or argv[1] not in ("smi", "json"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    mode, ref_path, mt_path = argv[1:]
    try:
        with open(mt_path) as f:
            mt = json.load(f)
        mt_gpus, mt_rows = matrix_of(mt)
        with open(ref_path) as f:
            if mode == "smi":
                ref_gpus, ref_rows = parse_smi(f.read())
                ref_name = "nvidia-smi"
            else:
                ref = json.load(f)
                ref_gpus, ref_rows = matrix_of(ref)
                ref_name = "reference"
    except (OSError, ValueError, KeyError) as e:
        print(f"compare_topo: cannot read the input: {e}", file=sys.stderr)
        return 2
    diffs = compare_blocks(ref_gpus, ref_rows, mt_gpus, mt_rows, ref_name, "mt-topo")
    if mode == "json" and not diffs:
        ids_ref = [bus_id(g["pci_bus_id"] or "") for g in ref["gpus"]]
        ids_mt = [bus_id(g["pci_bus_id"] or "") for g in mt["gpus"]]
        if ids_ref != ids_mt:
            diffs.append(f"GPU bus ids: reference {ids_ref}, mt-topo {ids_mt}")
        if len(ref.get("nics", [])) != len(mt.get("nics", [])):
            # Informative only: NCCL lists the NICs it would use, hwloc every one it sees.
            print(f"note: NICs: reference {len(ref.get('nics', []))}, mt-topo "
                  f"{len(mt.get('nics', []))}")
    for d in diffs:
        print(d)
    n = len(mt_gpus)
    if diffs:
        print(f"compare_topo {mode}: {len(diffs)} difference(s) over {n} GPU(s)")
        return 1
    print(f"compare_topo {mode}: {n} GPU(s), {n * n} GPU pairs agree")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
