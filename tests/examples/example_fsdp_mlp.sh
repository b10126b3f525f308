#!/usr/bin/env bash
# examples/fsdp_mlp through mtrun with 2 ranks, f32 and bf16: it runs, prints every step, the
# loss falls, rank 0 prints its memory report; a global batch the ranks cannot split is refused.
#   example_fsdp_mlp.sh MTRUN FSDP_MLP
set -u
MTRUN=$1
PROG=$2
OUT=$(mktemp -d "${TMPDIR:-/tmp}/example_fsdp_mlp.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
FAILURES=0
fail() { echo "FAIL: $*" >&2; FAILURES=$((FAILURES + 1)); }

for dtype in f32 bf16; do
    log=$OUT/$dtype.log
    if ! "$MTRUN" --standalone --nproc_per_node 2 "$PROG" --layers 3 --width 32 --batch 16 \
        --steps 20 --lr 1e-2 --seed 3 --param-dtype "$dtype" >"$log" 2>&1; then
        fail "$dtype: fsdp_mlp exited non-zero"
        cat "$log" >&2
        continue
    fi
    first=$(sed -n 's/^\[rank0\]:step 0 loss \([0-9.]*\)$/\1/p' "$log")
    last=$(sed -n 's/^\[rank0\]:step 19 loss \([0-9.]*\)$/\1/p' "$log")
    steps=$(grep -c '^\[rank0\]:step [0-9]* loss ' "$log")
    [ "$steps" = 20 ] || fail "$dtype: $steps step lines from rank 0, expected 20"
    if [ -z "$first" ] || [ -z "$last" ]; then
        fail "$dtype: no loss for step 0 or step 19"
    elif ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.9 * a) }'; then
        fail "$dtype: loss went from $first to $last, expected a drop of at least 10%"
    else
        echo "ok: $dtype loss $first -> $last"
    fi
    grep -q '^\[rank0\]:  optimizer ' "$log" || fail "$dtype: no memory report from rank 0"
    grep -q '^\[rank1\]:step' "$log" && fail "$dtype: rank 1 printed steps"
done

log=$OUT/bad_batch.log
if "$MTRUN" --standalone --nproc_per_node 2 "$PROG" --batch 15 --steps 1 >"$log" 2>&1; then
    fail "a global batch of 15 on 2 ranks was accepted"
fi
grep -q 'multiple of the 2 ranks' "$log" || { fail "no message for the batch of 15"; cat "$log" >&2; }

[ "$FAILURES" = 0 ] && echo "example_fsdp_mlp: all passed"
exit $((FAILURES > 0))
