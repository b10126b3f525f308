#!/usr/bin/env bash
# Checkpoints of train_gpt through mtrun, as a user saves and resumes (docs/train_gpt.md). Tiny
# models, a few steps; tests/checkpoint/ckpt_tool.py does the comparisons.
# usage: ckpt_train_gpt.sh MTRUN TRAIN_GPT VARIANT
#   exact_resume   dp 2 x tp 2: 8 steps in one run against 4 steps, then --resume auto to 8: the
#                  same losses and grad norms to the last bit for steps 4-7, and the same bytes
#                  in every data file of both runs' step-8 checkpoints (weights and AdamW state)
#   reshard        the step-4 checkpoint of dp 2 x tp 2 resumed on 1 x 1, dp 4, tp 4 and dp 2
#                  (the same global batch) within 1e-5 relative of the uninterrupted run; and a
#                  checkpoint of 1 x 1 resumed on dp 2 x tp 2
#   crash_POINT    MT_TEST_CKPT_CRASH kills a rank with SIGKILL at POINT of step 4's save
#                  (after-file on rank 1, the others on rank 0): `latest` still names the
#                  complete step-2 checkpoint, --resume auto finishes with the uninterrupted
#                  run's losses and final checkpoint, and the next save removes the leftovers
#   fail_POINT_RANK  MT_TEST_CKPT_FAIL makes step 4's save fail on one rank at POINT (stage: its
#                  copy to host memory, inside mt_checkpoint_save; write: its data file, in the
#                  writer thread): every rank stops within seconds (no collective waits for the
#                  failed rank until MT_TIMEOUT_S), with the failing rank's message; `latest`
#                  still names step 2, and --resume auto finishes like the uninterrupted run
#   schedule       saved with --seed 9 --lr 5e-3 --warmup 4, resumed with none of them: the run
#                  continues with the checkpoint's schedule (identical losses and learning
#                  rates); resumed with another --lr: that one is used, and rank 0 says so
#   keep           --keep 2 leaves the 2 newest checkpoints; --keep 0 all of them; --keep 2 in a
#                  run resumed from an older step keeps the one it just saved and the newest other
set -u
MTRUN=$1
PROG=$2
VARIANT=$3
TMP_PREFIX=ckpt_train_gpt
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
TOOL=$(dirname "${BASH_SOURCE[0]}")/ckpt_tool.py
export MT_TIMEOUT_S=${MT_TIMEOUT_S:-60} MT_DEVICE=cpu

# lr large enough that the weights and the loss move visibly every step.
TINY=(--layers 2 --d-model 32 --heads 4 --seq 16 --lr 1e-2 --seed 7)
# dp ranks share the global batch of 4 sequences: --batch is per dp rank.
DP2TP2=(--dp 2 --tp 2 --batch 2)
# A variant whose test ran out of time should say where: every run gets its own limit.
RUN_LIMIT=60

# run NAME NPROC ARGS...: one train_gpt job that must succeed; metrics in $TMP/NAME.jsonl
run() {
    local name=$1 np=$2
    shift 2
    start_bg "$name" "$MTRUN" --standalone --nproc_per_node "$np" "$PROG" "${TINY[@]}" \
        --metrics "$TMP/$name.jsonl" "$@"
    expect_rc "$name" 0 "$RUN_LIMIT"
}

# tool WHAT ARGS...: a ckpt_tool.py check, counted as passed or failed
tool() {
    local what=$1
    shift
    check "$what" python3 "$TOOL" "$@"
}

# same_files A B: the data files (rank-*.bin) of two checkpoint folders are the same bytes
same_files() {
    local a=$1 b=$2 n=0 f
    for f in "$a"/rank-*.bin; do
        [ -e "$f" ] || break
        n=$((n + 1))
        if ! cmp -s "$f" "$b/${f##*/}"; then
            fail "$b/${f##*/} differs from $f"
            return
        fi
    done
    local m
    m=$(find "$b" -name 'rank-*.bin' | wc -l)
    if [ "$n" -gt 0 ] && [ "$n" -eq "$m" ]; then
        pass "$n data files of $b are byte-identical to $a's"
    else
        fail "data files: $n in $a, $m in $b"
    fi
}

# resumed NAME STEP: NAME's run said it resumed at STEP with the optimizer state
resumed() {
    check "$1 resumed at step $2 with the optimizer" \
        grep -qE "resumed from .*/step-$(printf %08d "$2") at step $2 \(model and optimizer state\)" \
        "$TMP/$1.out"
}

# steps_are DIR NAMES...: DIR holds exactly these checkpoint folders (and `latest`)
steps_are() {
    local dir=$1 got
    shift
    got=$(cd "$dir" && ls -d step-* 2>/dev/null | tr '\n' ' ')
    if [ "$got" = "$* " ]; then
        pass "$dir holds $*"
    else
        fail "$dir holds '$got', expected '$* '"
    fi
}

case $VARIANT in
exact_resume)
    run full 4 "${DP2TP2[@]}" --steps 8 --save-every 4 --checkpoint-dir "$TMP/full"
    run part1 4 "${DP2TP2[@]}" --steps 4 --save-every 4 --checkpoint-dir "$TMP/part"
    tool "the interrupted run's steps 0-3 equal the full run's" \
        compare "$TMP/full.jsonl" "$TMP/part1.jsonl" 0 3 exact
    tool "part's latest is step 4" committed "$TMP/part" 4
    run part2 4 "${DP2TP2[@]}" --steps 8 --save-every 4 --checkpoint-dir "$TMP/part" \
        --resume auto
    resumed part2 4
    tool "steps 4-7 after resuming equal the full run's to the bit" \
        compare "$TMP/full.jsonl" "$TMP/part2.jsonl" 4 7 exact
    tool "part's latest is step 8" committed "$TMP/part" 8
    same_files "$TMP/full/step-00000008" "$TMP/part/step-00000008"
    ;;
reshard)
    TOL=1e-5 # other layouts sum in other orders: ~1e-7 relative (tests/examples/train_gpt.sh)
    run full 4 "${DP2TP2[@]}" --steps 8 --save-every 4 --checkpoint-dir "$TMP/full"
    ckpt=$TMP/full/step-00000004
    # resharded NAME NPROC LAYOUT...: resumed from ckpt on that layout, within TOL of full
    resharded() {
        local name=$1 np=$2
        shift 2
        run "$name" "$np" "$@" --steps 8 --resume "$ckpt"
        resumed "$name" 4
        tool "$name: steps 4-7 within $TOL of dp 2 x tp 2" \
            compare "$TMP/full.jsonl" "$TMP/$name.jsonl" 4 7 "$TOL"
    }
    # The same 4 sequences per step on every layout.
    resharded one 1 --batch 4
    resharded dp4 4 --dp 4 --batch 1
    resharded tp4 4 --tp 4 --batch 4
    resharded dp2 2 --dp 2 --batch 2
    check "one ran on the mesh dp 1 x tp 1" has_text "$TMP/one.out" 'mesh {"dp": 1, "tp": 1}'
    check "tp4 ran on the mesh dp 1 x tp 4" has_text "$TMP/tp4.out" 'mesh {"dp": 1, "tp": 4}'
    # The other way: saved by one rank at step 6, resumed on dp 2 x tp 2.
    run one_save 1 --batch 4 --steps 6 --save-every 6 --checkpoint-dir "$TMP/one" \
        --resume "$ckpt"
    run back 4 "${DP2TP2[@]}" --steps 8 --resume "$TMP/one"
    resumed back 6
    tool "1 x 1 -> dp 2 x tp 2: steps 6-7 within $TOL" \
        compare "$TMP/full.jsonl" "$TMP/back.jsonl" 6 7 "$TOL"
    ;;
crash_*)
    point=${VARIANT#crash_}
    point=${point//_/-}
    # after-file is a data file of any rank: the first that is not the one that commits.
    rank=0
    [ "$point" = after-file ] && rank=1
    common=(--dp 2 --batch 2 --steps 6 --checkpoint-dir)
    run ref 2 "${common[@]}" "$TMP/ref" --save-every 2
    start_bg crash env MT_TEST_CKPT_CRASH="$point:$rank:4" "$MTRUN" --standalone \
        --nproc_per_node 2 "$PROG" "${TINY[@]}" "${common[@]}" "$TMP/ck" --save-every 2
    expect_rc crash nonzero "$RUN_LIMIT"
    expect_text crash err "rank $rank: MT_TEST_CKPT_CRASH: killed at $point of step 4"
    expect_text crash err "rank $rank (node 0, local rank $rank) was killed by signal 9"
    # Whatever the point, the last committed checkpoint is step 2, and `latest` names it.
    tool "after the crash, latest names the complete step 2" committed "$TMP/ck" 2
    case $point in
    before-latest) # renamed, never named: complete, and left for the next save of step 4
        check "step-00000004's metadata.json parses" python3 -c \
            'import json, sys; json.load(open(sys.argv[1]))' "$TMP/ck/step-00000004/metadata.json"
        steps_are "$TMP/ck" step-00000002 step-00000004
        save_every=2 ;;
    *) # the interrupted save is only step-00000004.tmp
        check "the interrupted save left step-00000004.tmp" test -d "$TMP/ck/step-00000004.tmp"
        steps_are "$TMP/ck" step-00000002 step-00000004.tmp
        # Resumed saves at 3 and 6, never at 4: only the cleanup of a save can remove it.
        save_every=3 ;;
    esac
    run resume 2 "${common[@]}" "$TMP/ck" --save-every "$save_every" --resume auto
    resumed resume 2
    tool "steps 2-5 after the crash equal the uninterrupted run's to the bit" \
        compare "$TMP/ref.jsonl" "$TMP/resume.jsonl" 2 5 exact
    tool "latest names step 6" committed "$TMP/ck" 6
    same_files "$TMP/ref/step-00000006" "$TMP/ck/step-00000006"
    if [ "$save_every" = 2 ]; then
        steps_are "$TMP/ck" step-00000002 step-00000004 step-00000006
        same_files "$TMP/ref/step-00000004" "$TMP/ck/step-00000004"
    else
        steps_are "$TMP/ck" step-00000002 step-00000003 step-00000006
    fi
    ;;
fail_*)
    spec=${VARIANT#fail_}
    point=${spec%_*}
    rank=${spec##*_}
    common=(--dp 2 --batch 2 --steps 6 --save-every 2 --checkpoint-dir)
    run ref 2 "${common[@]}" "$TMP/ref"
    SECONDS=0
    start_bg failing env MT_TEST_CKPT_FAIL="$point:$rank:4" MT_TIMEOUT_S=60 "$MTRUN" --standalone \
        --nproc_per_node 2 "$PROG" "${TINY[@]}" "${common[@]}" "$TMP/ck"
    expect_rc failing nonzero "$RUN_LIMIT"
    # A collective waiting for the failed rank would end only after MT_TIMEOUT_S (60 s).
    check "every rank stopped within 30 s (took $SECONDS s)" test "$SECONDS" -lt 30
    expect_text failing err "injected by MT_TEST_CKPT_FAIL"
    check "the failure names rank $rank" grep -q "rank $rank: checkpoint: cannot" "$TMP/failing.err"
    tool "after the failed save, latest names the complete step 2" committed "$TMP/ck" 2
    run resume 2 "${common[@]}" "$TMP/ck" --resume auto
    resumed resume 2
    tool "steps 2-5 after the failed save equal the uninterrupted run's to the bit" \
        compare "$TMP/ref.jsonl" "$TMP/resume.jsonl" 2 5 exact
    ;;
schedule)
    # Not TINY's schedule: the resumed run must take it from the checkpoint, not the defaults.
    sched=(--dp 2 --batch 2 --steps 6 --save-every 3 --checkpoint-dir "$TMP/ck")
    run saved 2 "${sched[@]}" --seed 9 --lr 5e-3 --warmup 4
    start_bg plain "$MTRUN" --standalone --nproc_per_node 2 "$PROG" --layers 2 --d-model 32 \
        --heads 4 --seq 16 --dp 2 --batch 2 --steps 6 --resume "$TMP/ck/step-00000003" \
        --metrics "$TMP/plain.jsonl"
    expect_rc plain 0 "$RUN_LIMIT"
    tool "resumed without schedule options: steps 3-5 equal the saved run's to the bit" \
        compare "$TMP/saved.jsonl" "$TMP/plain.jsonl" 3 5 exact
    start_bg lr "$MTRUN" --standalone --nproc_per_node 2 "$PROG" --layers 2 --d-model 32 \
        --heads 4 --seq 16 --dp 2 --batch 2 --steps 6 --lr 1e-3 --resume "$TMP/ck/step-00000003"
    expect_rc lr 0 "$RUN_LIMIT"
    expect_text lr out "resumed with --lr 0.001 instead of the checkpoint's 0.005 (not a continuation"
    ;;
keep)
    run keep2 2 --dp 2 --batch 2 --steps 5 --save-every 1 --keep 2 --checkpoint-dir "$TMP/k2"
    steps_are "$TMP/k2" step-00000004 step-00000005
    tool "keep 2: latest names step 5" committed "$TMP/k2" 5
    run keep0 2 --dp 2 --batch 2 --steps 5 --save-every 1 --keep 0 --checkpoint-dir "$TMP/k0"
    steps_are "$TMP/k0" step-00000001 step-00000002 step-00000003 step-00000004 step-00000005
    # Resumed from an older step, with newer ones on disk: the checkpoint just saved (step 3,
    # replacing the old step-3) stays, with the newest of the others.
    run older 2 --dp 2 --batch 2 --steps 3 --save-every 1 --keep 2 --checkpoint-dir "$TMP/k0" \
        --resume "$TMP/k0/step-00000002"
    resumed older 2
    steps_are "$TMP/k0" step-00000003 step-00000005
    tool "keep 2 after resuming at 2: latest names step 3" committed "$TMP/k0" 3
    ;;
*)
    fail "unknown variant '$VARIANT'"
    ;;
esac
finish
