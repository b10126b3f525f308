#!/usr/bin/env bash
# mt-bench-checkpoint on a tiny model, 2 ranks, so that it cannot rot: it runs to the end, with
# --json stdout carries only rank 0's JSON objects (the disk line, then every measurement with
# its reference and ratio), the bench's folder is gone afterwards, and bad options exit 2. The
# page cache is emptied per file (--no-drop-caches): a test must not empty the whole machine's.
# Figures are not checked (docs/benchmarks.md has them).
MTRUN=$1
BENCH=$2
TMP_PREFIX=bench_ckpt
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/bench_lib.sh"

"$MTRUN" --standalone --nproc_per_node 2 "$BENCH" --dir "$TMP/d" --layers 1 --d-model 32 \
    --heads 2 --seq 16 --batch 1 --saves 2 --no-drop-caches --json >"$TMP/out" 2>"$TMP/err" ||
    { fail "bench exited $?"; cat "$TMP/err"; }

python3 - "$TMP/out" <<'PY' || fail "the JSON report"
import json, sys
recs = []
for line in open(sys.argv[1]).read().splitlines():
    assert line.startswith("[rank0]:"), f"stdout line not from rank 0: {line!r}"
    recs.append(json.loads(line[len("[rank0]:"):]))
disk = recs[0]
assert disk["measure"] == "disk", disk
for key in ("dir", "statfs_type", "fs", "df", "read_cache", "dd_read"):
    assert key in disk, f"{key} missing in {disk}"
assert disk["read_cache"] == "posix_fadvise DONTNEED", disk
rows = {r["measure"]: r for r in recs[1:]}
want = {"step": None, "step_save": "step", "step_during_write": "step",
        "stall_call": "host copy", "stall_stats": "host copy", "stall_first": "host copy",
        "write_files": "dd write",
        "write_commit": "dd write", "read_load": "dd read"}
assert sorted(rows) == sorted(want), f"measures: {sorted(rows)}"
for name, ref in want.items():
    r = rows[name]
    assert r["ranks"] == 2 and r["time_s"] > 0, r
    if ref is None:
        assert "ref" not in r, r
        continue
    assert r["ref"] == ref and r["ref_time_s"] > 0, r
    rate = name.startswith(("write", "read"))
    ratio = r["ref_time_s"] / r["time_s"] if rate else r["time_s"] / r["ref_time_s"]
    assert abs(ratio - r["ratio"]) <= 1e-6 * ratio, r
    if "bytes" in r:
        gbs = r["bytes"] / r["time_s"] / 1e9
        assert r["bytes"] > 0 and abs(r["gbs"] - gbs) <= 1e-6 * gbs, r
# One rank's bytes for the stall, all ranks' for the disk.
assert rows["write_commit"]["bytes"] == 2 * rows["stall_call"]["bytes"], rows
assert rows["write_commit"]["goal"] == ">= 0.80" and rows["stall_call"]["goal"] == "<= 1.00"
print(f"ok: {len(recs)} JSON lines, every measure with its reference and ratio")
PY

if [ -n "$(ls -A "$TMP/d" 2>/dev/null)" ]; then
    fail "the bench left files in its --dir: $(ls -R "$TMP/d")"
else
    pass "the bench's folder was removed"
fi

refuses_options "$BENCH" mt-bench-checkpoint "--saves 0" "--saves 65" "--layers x" "--bogus 1" \
    "--layers 2"
exit $((FAILURES > 0))
