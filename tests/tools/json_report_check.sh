#!/bin/sh
# Checks an `mt-topo --json` report against the fields issue 3 names (exact names and types, gpus
# sorted by index, TP groups sorted and ordered, [] for a tp above the GPU count). Needs python3.
# usage: json_report_check.sh REPORT.json [EXPECTED_SOURCE]
exec python3 - "$@" <<'PY'
import json
import sys


def fail(msg):
    print("json_report_check: " + msg)
    sys.exit(1)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def main():
    with open(sys.argv[1]) as f:
        r = json.load(f)
    if not isinstance(r, dict):
        fail("the report is not an object")
    for key in ("source", "gpus", "nics", "matrix", "nvlink_islands", "tp_groups"):
        if key not in r:
            fail("no field %r" % key)
    if not isinstance(r["source"], str):
        fail("source is not a string")
    if len(sys.argv) > 2 and r["source"] != sys.argv[2]:
        fail("source is %r, expected %r" % (r["source"], sys.argv[2]))
    gpus, nics = r["gpus"], r["nics"]
    gpu_fields = {"index": is_int, "pci_bus_id": lambda v: isinstance(v, str),
                  "name": lambda v: isinstance(v, str),
                  "numa_node": lambda v: v is None or is_int(v),
                  "cpu_affinity": lambda v: isinstance(v, str),
                  "nvlinks": lambda v: v is None or is_int(v)}
    for g in gpus:
        for k, ok in gpu_fields.items():
            if k not in g or not ok(g[k]):
                fail("gpu %r: field %s missing or of the wrong type" % (g.get("index"), k))
    idx = [g["index"] for g in gpus]
    if idx != sorted(idx) or len(set(idx)) != len(idx):
        fail("gpus are not sorted by unique index: %r" % idx)
    nic_fields = {"index": is_int, "name": lambda v: isinstance(v, str),
                  "pci_bus_id": lambda v: v is None or isinstance(v, str),
                  "numa_node": lambda v: v is None or is_int(v)}
    for i, n in enumerate(nics):
        for k, ok in nic_fields.items():
            if k not in n or not ok(n[k]):
                fail("nic %d: field %s missing or of the wrong type" % (i, k))
        if n["index"] != i:
            fail("nic %d has index %r" % (i, n["index"]))
    m = r["matrix"]
    labels = ["GPU%d" % i for i in idx] + ["NIC%d" % i for i in range(len(nics))]
    if not isinstance(m, dict) or m.get("labels") != labels:
        fail("matrix labels are %r, expected %r" % (m.get("labels"), labels))
    rows = m.get("rows")
    if not isinstance(rows, list) or len(rows) != len(labels):
        fail("matrix has %r rows for %d labels" % (None if rows is None else len(rows), len(labels)))
    codes = {"X", "PIX", "PXB", "PHB", "NODE", "SYS"}
    for i, row in enumerate(rows):
        if len(row) != len(labels) or row[i] != "X":
            fail("matrix row %d is not square or has no X on the diagonal" % i)
        for j, c in enumerate(row):
            if not isinstance(c, str) or not (c in codes or (c.startswith("NV") and c[2:].isdigit())):
                fail("matrix[%d][%d] is %r" % (i, j, c))
            if c != rows[j][i]:
                fail("matrix is not symmetric at %d,%d" % (i, j))
    islands = r["nvlink_islands"]
    flat = [x for isl in islands for x in isl]
    if sorted(flat) != sorted(idx) or not all(all(is_int(x) for x in isl) for isl in islands):
        fail("nvlink_islands %r do not partition the GPUs" % islands)
    tp = r["tp_groups"]
    if not isinstance(tp, dict) or sorted(tp.keys()) != ["2", "4", "8"]:
        fail("tp_groups keys are %r" % (sorted(tp.keys()) if isinstance(tp, dict) else tp))
    for k, groups in tp.items():
        size = int(k)
        if size > len(gpus) and groups != []:
            fail("tp_groups[%s] is %r for %d GPUs, expected []" % (k, groups, len(gpus)))
        for g in groups:
            if len(g) != size or g != sorted(g):
                fail("tp_groups[%s] group %r is not %d ascending GPUs" % (k, g, size))
        firsts = [g[0] for g in groups]
        if firsts != sorted(firsts):
            fail("tp_groups[%s] are not ordered by their first GPU" % k)
        if groups and sorted(x for g in groups for x in g) != sorted(idx):
            fail("tp_groups[%s] do not partition the GPUs" % k)


main()
PY
