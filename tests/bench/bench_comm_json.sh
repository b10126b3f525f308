#!/usr/bin/env bash
# mt-bench-comm under mtrun: with --json, stdout carries only JSON objects (behind mtrun's
# [rank0]: prefix), one per op and size, with nccl-tests' busbw factors; bad options exit 2.
MTRUN=$1
BENCH=$2
TMP_PREFIX=bench_json
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/bench_lib.sh"

"$MTRUN" --standalone --nproc_per_node 3 "$BENCH" --min-bytes 1KiB --max-bytes 256KiB \
    --iters 2 --warmup 1 --json >"$TMP/out" 2>"$TMP/err" ||
    { fail "bench exited $?"; cat "$TMP/err"; }

python3 - "$TMP/out" <<'PY' || fail "the JSON report"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
ops = {"all_gather": 2 / 3, "reduce_scatter": 2 / 3, "all_reduce": 4 / 3}
seen = {}
for line in lines:
    assert line.startswith("[rank0]:"), f"stdout line not from rank 0: {line!r}"
    rec = json.loads(line[len("[rank0]:"):])
    for key in ("op", "bytes", "time_us", "algbw_gbs", "busbw_gbs"):
        assert key in rec, f"{key} missing in {rec}"
    assert rec["op"] in ops, rec
    algbw = rec["bytes"] / (rec["time_us"] * 1e-6) / 1e9
    assert abs(algbw - rec["algbw_gbs"]) <= 1e-3 + 1e-3 * algbw, rec
    assert abs(rec["busbw_gbs"] - rec["algbw_gbs"] * ops[rec["op"]]) <= 1e-3 + 1e-3 * algbw, rec
    seen.setdefault(rec["op"], []).append(rec["bytes"])
assert sorted(seen) == sorted(ops), f"ops reported: {sorted(seen)}"
for op, sizes in seen.items():
    assert len(sizes) >= 8, f"{op}: only {len(sizes)} sizes: {sizes}"
    assert sizes == sorted(sizes), sizes
print(f"ok: {len(lines)} JSON lines, all ops, busbw factors right")
PY

refuses_options "$BENCH" mt-bench-comm "--iters 0" "--min-bytes 12G" "--op scatter" \
    "--min-bytes 2MiB --max-bytes 1MiB"
exit $((FAILURES > 0))
