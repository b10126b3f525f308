#!/usr/bin/env bash
# mt-bench-offload on small sizes, so that it cannot rot. The table: a header naming the stager
# path (ucx), the UCX and the ucx_perftest, one row per size from 64 KiB to 1 MiB (64 KiB,
# 256 KiB, 1 MiB) with positive stage and copy figures and a positive ucx_perftest figure (or "-"
# when there is no ucx_perftest of the UCX it loaded, which the header then says), and the
# overlap line with positive times. --json: one object per size with the same figures, then the
# overlap object. --no-perftest gives "-" and says so. Bad options exit 2. Figures are not
# checked (docs/benchmarks.md has them).
BENCH=$1
TMP_PREFIX=bench_offload
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/bench_lib.sh"

"$BENCH" --min-bytes 64KiB --max-bytes 1MiB --total 8MiB --reps 1 --overlap-bytes 1MiB \
    >"$TMP/out" 2>"$TMP/err" ||
    { fail "bench exited $?"; cat "$TMP/err"; }
check "header names the ucx path and the UCX" grep -q '^# mt-bench-offload: device cpu, stager path ucx, UCX [0-9]' "$TMP/out"
check "header has the column names" grep -qE '^# +bytes +stage_h2d +stage_d2h +copy_h2d +copy_d2h +perf_h2d +perf_d2h$' "$TMP/out"
check "three rows and the overlap line" test "$(grep -vc '^#' "$TMP/out")" -eq 4
have_perf=1
grep -q '(no ucx_perftest: ' "$TMP/out" && have_perf=0
for bytes in 65536 262144 1048576; do
    check "row for $bytes bytes with positive figures" awk -v b="$bytes" -v perf="$have_perf" '
        $1 == b && NF == 7 {
            for (i = 2; i <= 5; i++) if (!($i + 0 > 0)) exit 1
            if (perf ? !($6 + 0 > 0 && $7 + 0 > 0) : !($6 == "-" && $7 == "-")) exit 1
            found = 1
        }
        END { exit !found }' "$TMP/out"
done
check "overlap line with positive times" awk '
    $1 == "overlap" && $2 == "bytes=1048576" {
        for (i = 3; i <= 5; i++) { split($i, kv, "="); if (!(kv[2] + 0 > 0)) exit 1 }
        found = 1
    }
    END { exit !found }' "$TMP/out"

"$BENCH" --min-bytes 64KiB --max-bytes 256KiB --total 4MiB --reps 1 --overlap-bytes 256KiB \
    --json >"$TMP/json" 2>"$TMP/err" || { fail "bench --json exited $?"; cat "$TMP/err"; }
if python3 - "$TMP/json" "$have_perf" <<'PY'
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
have_perf = sys.argv[2] == "1"
rows = [r for r in recs if "test" not in r]
assert [r["bytes"] for r in rows] == [65536, 262144], rows
for r in rows:
    assert r["path"] == "ucx" and r["copy"] == "memcpy", r
    for k in ("stage_h2d_gbs", "stage_d2h_gbs", "copy_h2d_gbs", "copy_d2h_gbs"):
        assert r[k] > 0, (k, r)
    assert r["perftest_mem_h2d"] == r["perftest_mem_d2h"] == "host,host", r
    for k in ("perftest_h2d_gbs", "perftest_d2h_gbs"):
        assert (r[k] > 0) if have_perf else r[k] is None, (k, r)
over = [r for r in recs if r.get("test") == "overlap"]
assert len(over) == 1 and over[0]["bytes"] == 262144 and over[0]["copy_ms"] > 0, over
assert recs[-1] is over[0], "the overlap object comes last"
PY
then pass "JSON report: rows and overlap object"; else fail "the JSON report"; fi

"$BENCH" --min-bytes 64KiB --max-bytes 64KiB --total 1MiB --reps 1 --overlap-bytes 0 \
    --no-perftest >"$TMP/noperf" 2>"$TMP/err" || { fail "bench --no-perftest exited $?"; cat "$TMP/err"; }
check "--no-perftest: '-' in the perf columns" awk '$1 == 65536 && $6 == "-" && $7 == "-" { f = 1 } END { exit !f }' "$TMP/noperf"
check "--no-perftest: the header says so" grep -q '(no ucx_perftest: --no-perftest)' "$TMP/noperf"

refuses_options "$BENCH" mt-bench-offload "--reps 0" "--min-bytes x" "--bogus 1" "--total" \
    "--min-bytes 2MiB --max-bytes 1MiB" "--overlap-bytes x" "--perftest" \
    "--perftest /bin/true --no-perftest"
finish
