#!/usr/bin/env bash
# The capacity demonstration of FSDP offload (examples/fsdp_offload_demo.c, docs/offload.md) as
# a test, on one rank with MT_CPU_DEVICE_MEMORY below the model's training state:
#   - without offload the run is refused with the out-of-memory error naming the category;
#   - with --offload full the same model trains under the same cap (exit 0, the loss falls), the
#     device's peak (mt_device_mem_stats) stays within the cap, and the host tier
#     (mt_host_mem_stats) holds the training state: params + grads + optimizer = 16 bytes per
#     parameter (f32 master, gradient, two AdamW moments), more than the whole device;
#   - an offload ratio outside [0, 1] given to the engine is one error naming the range;
#   - layers offloaded (optimizer, full) under a root without offload: losses bitwise equal to
#     no offload (the last gradient of each backward is landed);
#   - --offload-ratio abc and --lr abc are refused, not read as 0.
# usage: fsdp_offload_demo.sh MTRUN DEMO CAPACITY
set -u
MTRUN=$1
DEMO=$2
CAPACITY=$3
TMP_PREFIX=fsdp_offload
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export MT_TIMEOUT_S=${MT_TIMEOUT_S:-60} MT_DEVICE=cpu MT_CPU_DEVICE_MEMORY=$CAPACITY

start_bg none "$MTRUN" --standalone --nproc_per_node 1 "$DEMO" --offload none
expect_rc none nonzero 120
if grep -qE "out of memory on cpu: asked [0-9.]+ [KMG]?i?B for (params|grads|optimizer|activations|comm|other), [0-9.]+ [KMG]?i?B left of " "$TMP/none.err" "$TMP/none.out"; then
    pass "no offload: $(grep -ohE 'out of memory on cpu: asked [^(]*' "$TMP/none.err" "$TMP/none.out" | head -n 1)"
else
    fail "no offload: no 'out of memory on cpu: asked ... for <category>, ... left of' message"
    show none
fi

start_bg full "$MTRUN" --standalone --nproc_per_node 1 "$DEMO" --offload full
expect_rc full 0 180
first=$(grep -oE 'step 0 loss [0-9.eE+-]+' "$TMP/full.out" | awk '{print $4}')
last=$(grep -oE 'step [0-9]+ loss [0-9.eE+-]+' "$TMP/full.out" | tail -n 1 | awk '{print $4}')
if [ -n "$first" ] && [ -n "$last" ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'; then
    pass "full offload: trained under $CAPACITY, the loss went down from $first to $last"
else
    fail "full offload: the loss did not go down (first '$first', last '$last')"
    show full
fi
params=$(grep -oE '[0-9]+ parameters' "$TMP/full.out" | head -n 1 | awk '{print $1}')
acct=$(grep -oE 'accounting: .*' "$TMP/full.out" | head -n 1)
val() { sed -nE "s/.* $1=([0-9]+).*/\1/p" <<<" ${acct#accounting: }"; }
dpeak=$(val device_peak) dcap=$(val device_capacity) hpeak=$(val host_peak)
state=$(($(val host_params) + $(val host_grads) + $(val host_optimizer)))
check "full offload: device peak $dpeak within the capacity $dcap" \
    test -n "$dpeak" -a "$dcap" -gt 0 -a "$dpeak" -le "$dcap"
check "full offload: the host tier held the training state, 16 x $params = $state bytes" \
    test -n "$params" -a "$state" -eq $((16 * params))
check "full offload: the host tier ($hpeak) held more than the device could ($dcap)" \
    test "$hpeak" -gt "$dcap"

start_bg ratio "$MTRUN" --standalone --nproc_per_node 1 "$DEMO" --offload full \
    --offload-ratio 1.5
expect_rc ratio nonzero 60
if grep -qF "offload_ratio 1.5 is outside [0, 1]" "$TMP/ratio.err" "$TMP/ratio.out"; then
    pass "ratio 1.5: $(grep -ohF "offload_ratio 1.5 is outside [0, 1]" "$TMP/ratio.err" "$TMP/ratio.out" | head -n 1)"
else
    fail "ratio 1.5: no 'offload_ratio 1.5 is outside [0, 1]' from the engine"
    show ratio
fi

# Layers offloaded under a root without offload (a valid setup: options are per unit): the last
# gradient of each backward lands although the root has no offload context of its own, so the
# losses equal those of no offload bit for bit (9 significant digits identify a float).
SMALL=(--layers 3 --width 64 --batch 4 --steps 6 --lr 1e-2)
start_bg ref "$MTRUN" --standalone --nproc_per_node 1 "$DEMO" "${SMALL[@]}" --offload none
expect_rc ref 0 120
grep -oE 'step [0-9]+ loss [0-9.eE+-]+' "$TMP/ref.out" >"$TMP/ref.losses"
for p in optimizer full; do
    start_bg "root_$p" "$MTRUN" --standalone --nproc_per_node 1 "$DEMO" "${SMALL[@]}" \
        --offload "$p" --root-offload none
    expect_rc "root_$p" 0 120
    grep -oE 'step [0-9]+ loss [0-9.eE+-]+' "$TMP/root_$p.out" >"$TMP/root_$p.losses"
    check "layers offload $p under a root without offload: 6 losses bitwise equal to none" \
        sh -c "test \$(wc -l <'$TMP/ref.losses') -eq 6 && cmp -s '$TMP/ref.losses' '$TMP/root_$p.losses'"
done

# A value that is not a number is refused, not read as 0.
for c in "ratio --offload-ratio" "lr --lr"; do
    read -r n opt <<<"$c"
    start_bg "nan_$n" "$MTRUN" --standalone --nproc_per_node 1 "$DEMO" "$opt" abc
    expect_rc "nan_$n" nonzero 60
    check "$opt abc: refused as not a number" grep -qF -e "$opt 'abc' is not a number" \
        "$TMP/nan_$n.err" "$TMP/nan_$n.out"
done
finish
