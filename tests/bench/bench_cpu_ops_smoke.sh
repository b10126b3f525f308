#!/usr/bin/env bash
# mt-bench-cpu-ops at tiny sizes on 1 and 3 threads, so that it cannot rot: it runs to the end
# and prints one line per op with a positive rate; bad options exit 2. Rates are not checked
# (docs/benchmarks.md has them).
BENCH=$1
TMP_PREFIX=bench_cpu_ops
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/bench_lib.sh"

for t in 1 3; do
    MT_NUM_THREADS=$t "$BENCH" --rows 16 --channels 24 --heads 2 --seq 8 --vocab 20 --reps 3 \
        >"$TMP/out" 2>"$TMP/err" || { fail "threads $t: bench exited $?"; cat "$TMP/err"; }
    check "threads $t: the header" grep -q "^rows 16 channels 24 .* threads $t$" "$TMP/out"
    for op in embedding_forward embedding_backward layernorm_forward layernorm_backward \
        gelu_forward gelu_backward attention_forward attention_backward xent_loss_backward \
        cast_f32_bf16 accumulate_bf16 linear_forward_sgemm linear_backward_sgemm sum_squares_4CxC; do
        check "threads $t: $op" grep -q "^op $op " "$TMP/out"
    done
    bad_rate=$(awk '/^op / && $(NF-1) + 0 <= 0 { n++ } END { print n + 0 }' "$TMP/out")
    check "threads $t: every rate is positive" test "$bad_rate" = 0
    # The overwrite table: the five linears, both routes timed (positive medians), and the sum.
    for lin in 'C->3C' 'C->C' 'C->4C' '4C->C' 'C->vocab'; do
        check "threads $t: bf16 overwrite $lin" awk -v l="$lin" \
            '$1 == "bf16" && $2 == "overwrite" && $3 == l && $4 > 0 && $5 > 0 { ok = 1 }
             END { exit !ok }' "$TMP/out"
    done
    check "threads $t: bf16 overwrite sum" grep -q "^bf16 overwrite all: zeroed + add " "$TMP/out"
done
refuses_options "$BENCH" mt-bench-cpu-ops "--rows 0" "--reps x" "--seq 7" "--bogus 1" "--rows"
finish
