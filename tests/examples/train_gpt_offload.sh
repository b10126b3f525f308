#!/usr/bin/env bash
# FSDP offload (docs/offload.md) through train_gpt and mtrun, as a user runs it.
# usage: train_gpt_offload.sh MTRUN TRAIN_GPT VARIANT
#   equiv   20 steps in f32 on 1, 2 and 4 ranks (dp) and on 4 (dp 2 x tp 2): --offload optimizer
#           and full give the losses and gradient norms of --offload none bit for bit (the
#           metrics print 9 significant digits, which identify a float exactly), and so does
#           half the units offloaded (--offload-ratio 0.5); bf16 parameters and reduction on 2
#           ranks, and 2 micro-batches per step (no reduce-scatter on the first) likewise.
#           Clipping is on (train_gpt's default --clip 1), so the host-tier norm is in the loss. Each offload run must show a host tier in its memory report (the
#           policy took effect) and none the none run.
#   resume  a checkpoint saved at step 10 with --offload full on 2 ranks (the shard views point
#           to the host tier), resumed with --offload optimizer to step 20: steps 10..19 give the
#           losses and norms of an uninterrupted --offload none run bit for bit
#   errors  --offload-ratio outside [0, 1] and an unknown policy: one clear error, before any
#           rank trains; an injected UCX registration failure (MT_TEST_UCX_MEM_MAP_FAIL) and
#           host-tier allocation failure (MT_TEST_HOST_ALLOC_FAIL): one error naming the unit
#           and the call
#   overlap --offload-overlap with --clip 0 on 1 rank and dp 2 (and dp 2 with 2 micro-batches),
#           offload optimizer and full: the losses and norms of the same run without it bit for
#           bit, and units stepped while the backward ran (the count printed > 0); refused with
#           clipping on (train_gpt's default --clip 1) and without --offload
set -u
MTRUN=$1
PROG=$2
VARIANT=$3
TMP_PREFIX=train_gpt_offload
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export MT_TIMEOUT_S=${MT_TIMEOUT_S:-60} MT_DEVICE=cpu

MODEL=(--layers 3 --d-model 64 --heads 4 --seq 32 --batch 4 --steps 20 --lr 1e-3 --seed 5)

# run NAME RANKS OPTIONS...: a training run writing $TMP/NAME.jsonl
run() {
    local name=$1 np=$2
    shift 2
    "$MTRUN" --standalone --nproc_per_node "$np" "$PROG" "${MODEL[@]}" \
        --metrics "$TMP/$name.jsonl" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
}

# losses FILE: step, loss and grad norm of every step, as printed (exact float digits)
losses() {
    python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))' "$1"
}

# same_losses REF NAME: NAME's 20 steps equal REF's bit for bit
same_losses() {
    losses "$TMP/$1.jsonl" >"$TMP/$1.losses" && losses "$TMP/$2.jsonl" >"$TMP/$2.losses" &&
        test "$(wc -l <"$TMP/$1.losses")" -eq 20 && cmp -s "$TMP/$1.losses" "$TMP/$2.losses"
}

case "$VARIANT" in
equiv)
    CONFIGS=("np1 1" "dp2 2 --dp 2" "dp4 4 --dp 4" "dp2_tp2 4 --dp 2 --tp 2"
             "bf16 2 --dp 2 --param-dtype bf16 --reduce-dtype bf16"
             "accum 2 --dp 2 --grad-accum 2 --batch 2")
    for c in "${CONFIGS[@]}"; do
        read -r -a a <<<"$c"
        name=${a[0]} np=${a[1]} opts=("${a[@]:2}")
        if ! run "${name}_none" "$np" "${opts[@]}" --offload none; then
            fail "${name}_none: training failed"
            show "${name}_none"
            continue
        fi
        check "${name}_none: no host tier" sh -c "! grep -qF 'host memory tier' '$TMP/${name}_none.out'"
        modes=(optimizer full)
        [ "$name" = dp2 ] && modes+=(ratio)
        for m in "${modes[@]}"; do
            mopts=(--offload "$m")
            [ "$m" = ratio ] && mopts=(--offload full --offload-ratio 0.5)
            if ! run "${name}_$m" "$np" "${opts[@]}" "${mopts[@]}"; then
                fail "${name}_$m: training failed"
                show "${name}_$m"
                continue
            fi
            check "${name}_$m: the host tier held shards" has_text "$TMP/${name}_$m.out" \
                "host memory tier"
            check "${name}_$m: 20 losses and norms bitwise equal to --offload none" \
                same_losses "${name}_none" "${name}_$m"
        done
    done
    # The comparison would pass on runs that ignore the policy: the device's params peak must
    # fall with full offload (it holds only units in flight) on 4 ranks.
    peak() { python3 -c 'import json,sys; print(max(json.loads(l)["peak_bytes"]["params"] for l in open(sys.argv[1])))' "$1"; }
    none_p=$(peak "$TMP/dp4_none.jsonl") full_p=$(peak "$TMP/dp4_full.jsonl")
    check "dp4: device params peak with full offload ($full_p) below none ($none_p)" \
        test "$full_p" -lt "$none_p"
    ;;
resume)
    MODEL=("${MODEL[@]}" --dp 2)
    run none 2 --offload none || fail "none: training failed"
    run first 2 --steps 10 --save-every 10 --checkpoint-dir "$TMP/ckpt" --offload full ||
        fail "first 10 steps (full offload, saving) failed"
    run resumed 2 --checkpoint-dir "$TMP/ckpt" --resume auto --offload optimizer ||
        fail "resumed run (optimizer offload) failed"
    check "resumed: from the step-10 checkpoint" has_text "$TMP/resumed.out" \
        "resumed from $TMP/ckpt/step-00000010 at step 10 (model and optimizer state)"
    losses "$TMP/none.jsonl" | tail -n 10 >"$TMP/none.tail"
    losses "$TMP/resumed.jsonl" >"$TMP/resumed.losses"
    check "resumed: steps 10..19 bitwise equal to the uninterrupted run without offload" \
        sh -c "test \$(wc -l <'$TMP/resumed.losses') -eq 10 && cmp -s '$TMP/none.tail' '$TMP/resumed.losses'"
    ;;
errors)
    for r in 1.5 -0.1 nan; do
        run "ratio_$r" 1 --offload full --offload-ratio "$r"
        rc=$?
        check "--offload-ratio $r refused (rc $rc)" test "$rc" -ne 0
        check "--offload-ratio $r: the message names the range" grep -qF -e \
            "--offload-ratio '$r' must be a number in [0, 1]" "$TMP/ratio_$r.err" \
            "$TMP/ratio_$r.out"
    done
    # Injected failures of the staging registration and of the host tier: one error naming
    # the unit, the call and what to do, never a crash.
    # injected VAR NAME POLICY WHAT REGEX: the run with VAR=1 fails with REGEX in its output
    injected() {
        env "$1=1" "$MTRUN" --standalone --nproc_per_node 1 "$PROG" "${MODEL[@]}" --offload "$3" \
            >"$TMP/$2.out" 2>"$TMP/$2.err"
        local rc=$?
        check "$4: the run fails (rc $rc)" test "$rc" -ne 0
        check "$4: one message naming the unit and the call" grep -qE "$5" "$TMP/$2.err" \
            "$TMP/$2.out"
    }
    injected MT_TEST_UCX_MEM_MAP_FAIL memmap full "registration failure" \
        "mt_fsdp_shard\\('[^']+'\\): cannot register .* ucp_mem_map failed: .*RLIMIT_MEMLOCK"
    injected MT_TEST_HOST_ALLOC_FAIL hostfail optimizer "host tier failure" \
        "mt_fsdp_shard\\('[^']+'\\): cannot allocate .* of host memory for params"
    run policy 1 --offload disk
    check "--offload disk refused" test $? -ne 0
    check "--offload disk: the message lists the policies" grep -qF -e \
        "--offload 'disk' must be none, optimizer or full" "$TMP/policy.err" "$TMP/policy.out"
    ;;
overlap)
    CONFIGS=("np1 1" "dp2 2 --dp 2" "accum 2 --dp 2 --grad-accum 2 --batch 2")
    for c in "${CONFIGS[@]}"; do
        read -r -a a <<<"$c"
        name=${a[0]} np=${a[1]} opts=("${a[@]:2}" --clip 0)
        for m in optimizer full; do
            if ! run "${name}_${m}" "$np" "${opts[@]}" --offload "$m" ||
                ! run "${name}_${m}_ov" "$np" "${opts[@]}" --offload "$m" --offload-overlap; then
                fail "${name}_$m: training failed"
                show "${name}_${m}_ov"
                continue
            fi
            check "${name}_$m: 20 losses and norms with --offload-overlap bitwise equal" \
                same_losses "${name}_$m" "${name}_${m}_ov"
            check "${name}_$m: units stepped while the backward ran" grep -qE \
                "offload overlap \(rank 0, last step\): [1-9][0-9]* of [0-9]+ units" \
                "$TMP/${name}_${m}_ov.out"
        done
    done
    run clip 1 --offload optimizer --offload-overlap
    rc=$?
    check "--offload-overlap with clipping refused (rc $rc)" test "$rc" -ne 0
    check "--offload-overlap with clipping: the message says why" grep -qF -e \
        "--offload-overlap needs --clip 0" "$TMP/clip.err" "$TMP/clip.out"
    run nooff 1 --clip 0 --offload-overlap
    rc=$?
    check "--offload-overlap without --offload refused (rc $rc)" test "$rc" -ne 0
    check "--offload-overlap without --offload: the message says why" grep -qF -e \
        "--offload-overlap needs --offload optimizer or full" "$TMP/nooff.err" "$TMP/nooff.out"
    ;;
*)
    fail "unknown variant '$VARIANT'"
    ;;
esac
finish
