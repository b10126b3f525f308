#!/usr/bin/env bash
# mt-bench-gpt-step on a tiny GPT, so that it cannot rot: at 2 ranks its table line and the sgemm
# peak; at 1 rank (--json) one JSON object (behind mtrun's [rank0]: prefix) whose times are
# positive, whose exposed communication is 0 (one rank's collectives are copies, counted as
# engine) and whose percentages agree with its figures; at 2 ranks with --reshard-after-forward 0
# (--json, one round) the communication thread's CPU time is positive and with the engine's own
# adds up to the step's CPU time over the ops' (and --mapped-gather 0 is taken and reported); bad
# options exit 2, a global batch that does not
# divide is refused. Times are not checked (docs/benchmarks.md has them).
MTRUN=$1
BENCH=$2
TMP_PREFIX=bench_gpt_step
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/bench_lib.sh"
export MT_DEVICE=cpu
TINY=(--layers 2 --d-model 32 --heads 2 --seq 16 --vocab 64 --global-batch 4 --rounds 2)

"$MTRUN" --standalone --nproc_per_node 2 "$BENCH" "${TINY[@]}" >"$TMP/out" 2>"$TMP/err" ||
    { fail "bench exited $?"; cat "$TMP/err"; }
check "table header" grep -q "^\[rank0\]:# ranks" "$TMP/out"
check "a line for 2 ranks" grep -qE "^\[rank0\]: +2 +[0-9]+ +[0-9.]+" "$TMP/out"
check "the sgemm peak" grep -q "sgemm 2048^3: [0-9.]* GFLOP/s per rank" "$TMP/out"
check "the communication thread's share" grep -q "step - ops = the communication thread" \
    "$TMP/out"

"$MTRUN" --standalone --nproc_per_node 1 "$BENCH" "${TINY[@]}" --json >"$TMP/json" \
    2>"$TMP/err" || { fail "bench --json exited $?"; cat "$TMP/err"; }
check "one JSON object with positive times and the overhead" python3 - "$TMP/json" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1 and lines[0].startswith("[rank0]:{"), lines
r = json.loads(lines[0][len("[rank0]:"):])
for k in ("ops_ms", "comm_ms", "step_ms", "gemm_gflops_total", "model_gflops"):
    assert r[k] > 0, (k, r[k])
assert r["ranks"] == 1 and r["exposed_comm_ms"] == 0, r
assert abs(r["overhead_pct"] - 100 * r["overhead_ms"] / r["step_ms"]) < 1e-6, r
assert r["of_peak"] == r["model_gflops"] / r["gemm_gflops_total"], r
PY

"$MTRUN" --standalone --nproc_per_node 2 "$BENCH" "${TINY[@]}" --rounds 1 --json \
    --reshard-after-forward 0 --mapped-gather 0 >"$TMP/json2" 2>"$TMP/err" ||
    { fail "bench --json at 2 ranks exited $?"; cat "$TMP/err"; }
check "2 ranks: the communication thread's CPU and the engine's own" python3 - "$TMP/json2" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1 and lines[0].startswith("[rank0]:{"), lines
r = json.loads(lines[0][len("[rank0]:"):])
assert r["ranks"] == 2 and r["reshard_after_forward"] == 0 and r["mapped_gather"] == 0, r
assert r["step_comm_thread_cpu_ms"] > 0, r
# One round, and all three from one rank: the split adds up (f32 sums, rounding only).
assert abs(r["engine_cpu_ms"] + r["step_comm_thread_cpu_ms"] - r["overhead_cpu_ms"]) < 1e-3, r
PY
refuses_options "$BENCH" mt-bench-gpt-step "--rounds 0" "--layers x" "--bogus 1" "--seq" \
    "--reshard-after-forward 2" "--reshard-after-forward -1" "--reshard-after-forward +0" \
    "--mapped-gather 2"
# An empty value (refuses_options splits on spaces, so by hand).
"$BENCH" --reshard-after-forward "" >"$TMP/bad.out" 2>"$TMP/bad.err"
check "--reshard-after-forward '' refused" test $? -eq 2
# A global batch that does not divide over the ranks is refused by name.
"$MTRUN" --standalone --nproc_per_node 2 "$BENCH" "${TINY[@]}" --global-batch 3 >"$TMP/out" \
    2>"$TMP/err"
check "--global-batch 3 over 2 ranks refused" grep -q "global-batch 3 does not divide over 2" \
    "$TMP/err"
finish
