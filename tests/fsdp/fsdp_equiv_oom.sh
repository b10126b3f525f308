#!/usr/bin/env bash
# The demonstration of issue 5 as a test: with MT_CPU_DEVICE_MEMORY below the model's full
# training state, one rank fails with the out-of-memory error (non-zero exit, the message names
# the device, the size asked and the category), and 4 ranks with FSDP train the same model (exit
# 0, the loss goes down). Sizes: examples/fsdp_oom_demo.c (the default MLP: 8 x 1024 x 1024,
# 8.4 M parameters, 128 MiB of f32 AdamW state; 32 MiB per rank on 4 ranks).
# usage: fsdp_equiv_oom.sh MTRUN DEMO CAPACITY
set -u
MTRUN=$1
DEMO=$2
CAPACITY=$3
TMP_PREFIX=fsdp_oom
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export MT_TIMEOUT_S=${MT_TIMEOUT_S:-60} MT_DEVICE=cpu MT_CPU_DEVICE_MEMORY=$CAPACITY

start_bg one "$MTRUN" --standalone --nproc_per_node 1 "$DEMO"
expect_rc one nonzero 120
# e.g. "out of memory on cpu: asked 32.02 MiB for grads, 15.98 MiB left of 80.00 MiB (in use: ...)"
if grep -qE "out of memory on cpu: asked [0-9.]+ [KMG]?i?B for (params|grads|optimizer|activations|comm|other), [0-9.]+ [KMG]?i?B left of " "$TMP/one.err"; then
    pass "1 rank: $(grep -oE 'out of memory on cpu: asked [^(]*' "$TMP/one.err" | head -n 1)"
else
    fail "1 rank: no 'out of memory on cpu: asked ... for <category>, ... left of ...' message"
    show one
fi
expect_text one out "device capacity"

start_bg four "$MTRUN" --standalone --nproc_per_node 4 "$DEMO"
expect_rc four 0 180
if ! grep -qF "out of memory" "$TMP/four.err"; then pass "4 ranks: no out-of-memory"; else
    fail "4 ranks ran out of memory"
    show four
fi
first=$(grep -oE 'step 0 loss [0-9.eE+-]+' "$TMP/four.out" | awk '{print $4}')
last=$(grep -oE 'step [0-9]+ loss [0-9.eE+-]+' "$TMP/four.out" | tail -n 1 | awk '{print $4}')
if [ -n "$first" ] && [ -n "$last" ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'; then
    pass "4 ranks: the loss went down from $first to $last"
else
    fail "4 ranks: the loss did not go down (first '$first', last '$last')"
    show four
fi
finish
