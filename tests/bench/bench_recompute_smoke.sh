#!/usr/bin/env bash
# mt-bench-recompute on a tiny GPT, so that it cannot rot: it runs to the end on one process,
# prints its three timed lines and the ratio line, the activation peak with recompute is below
# the one without, and a bad option exits 2. Times are not checked (docs/benchmarks.md has them).
BENCH=$1
TMP_PREFIX=bench_recompute
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/bench_lib.sh"
export MT_DEVICE=cpu

"$BENCH" --layers 2 --d-model 32 --heads 2 --seq 16 --batch 2 --rounds 2 >"$TMP/out" 2>"$TMP/err" ||
    { fail "bench exited $?"; cat "$TMP/err"; }
for line in "forward only" "step, no recompute" "step, full recompute" "full / none"; do
    check "line '$line'" grep -qF -- "$line" "$TMP/out"
done
none=$(sed -n 's/.*step, no recompute .*activation peak \([0-9]*\) bytes/\1/p' "$TMP/out")
full=$(sed -n 's/.*step, full recompute .*activation peak \([0-9]*\) bytes/\1/p' "$TMP/out")
check "activation peak with recompute ($full) below without ($none)" \
    test -n "$none" -a -n "$full" -a "${full:-0}" -lt "${none:-0}"
refuses_options "$BENCH" mt-bench-recompute "--rounds 0" "--layers x" "--bogus 1" "--seq"
finish
