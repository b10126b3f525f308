#!/usr/bin/env bash
# The largest GPT that trains on RANKS CPU ranks under a per-rank device cap, with each
# large-model technique switched on in turn (docs/large-models.md):
#
#   bench/large_models.sh BUILD_DIR [--cap BYTES] [--ranks N] [--steps N] [--max-layers N]
#                         [--only NAME] [train_gpt model options...]
#
# For each configuration the number of layers is searched with train_gpt --predict-memory
# (the memory predictor, exact for these options: tests/examples/train_gpt_memory.sh), then the
# largest that fits is trained for --steps steps under MT_CPU_DEVICE_MEMORY=cap, and one layer
# more is shown not to fit. Prints one markdown row per configuration: layers, parameters,
# predicted and measured peak, tokens/s and the model FLOP/s they mean (train_gpt's FLOP per
# token: 6 x parameters + attention, recompute not counted), then a table of the measured peaks
# by category. Exits non-zero when a run that should fit fails.
set -u
BUILD=${1:?usage: large_models.sh BUILD_DIR [--cap BYTES] [--ranks N] [--steps N] [model options...]}
shift
CAP=512MiB RANKS=4 STEPS=3 MAX_LAYERS=1024 ONLY=
MODEL=(--d-model 256 --heads 8 --seq 1024 --batch 1 --lr 3e-4)
extra=()
while [ $# -gt 0 ]; do
    case $1 in
        --cap) CAP=$2; shift 2 ;;
        --ranks) RANKS=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --max-layers) MAX_LAYERS=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        *) extra+=("$1"); shift ;;
    esac
done
[ ${#extra[@]} -gt 0 ] && MODEL=("${extra[@]}")
half=$((RANKS / 2))
# NAME|OPTIONS: each adds one technique to the one before.
CONFIGS=(
    "fsdp|--dp $RANKS"
    "fsdp+tp|--dp $half --tp 2"
    "fsdp+tp+ac|--dp $half --tp 2 --activation-checkpointing full"
    "fsdp+tp+ac+sp|--dp $half --tp 2 --activation-checkpointing full --sequence-parallel"
)
export MT_DEVICE=cpu MT_CPU_DEVICE_MEMORY=$CAP
TMP=$(mktemp -d /tmp/large_models.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# fits LAYERS OPTIONS...: 0 when the predicted per-rank peak fits the cap, 1 when it does not,
# 2 when train_gpt refuses the configuration.
fits() {
    local layers=$1
    shift
    "$BUILD/bin/mtrun" --standalone --nproc_per_node "$RANKS" "$BUILD/bin/train_gpt" \
        "${MODEL[@]}" --layers "$layers" "$@" --predict-memory >"$TMP/predict.out" 2>&1
    case $? in 0) return 0 ;; 3) return 1 ;; *) return 2 ;; esac
}

# The largest layer count in [1, MAX_LAYERS] that fits (0: none does; -1: train_gpt refused a
# layer count, $TMP/predict.out says why, rather than reading the refusal as "does not fit").
largest() {
    fits 1 "$@"
    case $? in 1) echo 0; return ;; 2) echo -1; return ;; esac
    local lo=1 hi=2 rc
    while [ $hi -le "$MAX_LAYERS" ]; do
        fits $hi "$@"
        rc=$?
        [ $rc -eq 2 ] && { echo -1; return; }
        [ $rc -ne 0 ] && break
        lo=$hi
        hi=$((hi * 2))
    done
    [ $hi -gt "$MAX_LAYERS" ] && hi=$((MAX_LAYERS + 1))
    while [ $((hi - lo)) -gt 1 ]; do
        local mid=$(((lo + hi) / 2))
        fits $mid "$@"
        rc=$?
        [ $rc -eq 2 ] && { echo -1; return; }
        if [ $rc -eq 0 ]; then lo=$mid; else hi=$mid; fi
    done
    echo $lo
}

field() { sed -n "s/^\[rank0\]:$1//p" "$2" | head -1; }

echo "cap $CAP per rank, $RANKS ranks, model ${MODEL[*]}, $STEPS steps"
echo
echo "| configuration | layers | parameters | predicted peak | measured peak | tokens/s | model GFLOP/s |"
echo "|---|---|---|---|---|---|---|"
status=0
categories=()
for entry in "${CONFIGS[@]}"; do
    name=${entry%%|*}
    read -r -a opts <<<"${entry#*|}"
    [ -n "$ONLY" ] && [ "$ONLY" != "$name" ] && continue
    L=$(largest "${opts[@]}")
    if [ "$L" -lt 1 ]; then
        if [ "$L" -lt 0 ]; then
            echo "| $name | refused by train_gpt --predict-memory | | | | | |"
            cat "$TMP/predict.out" >&2
            status=1
        else
            echo "| $name | none fits | | | | | |"
        fi
        continue
    fi
    out="$TMP/$name.out"
    start=$(date +%s)
    "$BUILD/bin/mtrun" --standalone --nproc_per_node "$RANKS" "$BUILD/bin/train_gpt" \
        "${MODEL[@]}" --layers "$L" "${opts[@]}" --steps "$STEPS" >"$out" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    params=$(sed -n 's/^\[rank0\]:train_gpt: GPT .*: \([0-9]*\) parameters.*/\1/p' "$out" | head -1)
    tps=$(sed -n 's/^\[rank0\]:throughput[^:]*: \([0-9.]*\) tok\/s.*/\1/p' "$out" | head -1)
    fpt=$(sed -n 's/^\[rank0\]:train_gpt: \([0-9.e+]*\) FLOP per token.*/\1/p' "$out" | head -1)
    gflops=$(awk -v f="${fpt:-0}" -v t="${tps:-0}" 'BEGIN { printf "%.1f", f * t / 1e9 }')
    pred=$(sed -n 's/^\[rank0\]:  total  *\([0-9.]* [KMG]iB\)  (during.*/\1/p' "$out" | head -1)
    meas=$(sed -n 's/^\[rank0\]:  total  *[0-9.]* [KMG]iB  *\([0-9.]* [KMG]iB\)  *[0-9.]*$/\1/p' "$out" | head -1)
    if [ $rc -ne 0 ]; then
        echo "| $name | $L (failed: exit $rc) | ${params:-?} | $pred | | | |"
        tail -20 "$out" >&2
        status=1
        continue
    fi
    fits $((L + 1)) "${opts[@]}"
    case $? in
        0) more=fits ;;
        1) more="does not fit" ;;
        *) more="refused"; cat "$TMP/predict.out" >&2; status=1 ;;
    esac
    echo "| $name | $L ($((L + 1)): $more) | ${params:-?} | $pred | $meas | ${tps:-?} (${secs} s run) | $gflops |"
    # The measured per-category peaks (the comparison train_gpt prints at the end).
    row="| $name |"
    for cat in params grads optimizer activations comm; do
        v=$(sed -n "s/^\[rank0\]:  $cat  *[0-9.]* [KMG]iB  *\([0-9.]* [KMG]iB\)  *[0-9.]*\$/\1/p" "$out" | head -1)
        row="$row ${v:-?} |"
    done
    categories+=("$row")
done
echo
echo "Measured per-rank peak by category (the highest over ranks and steps):"
echo
echo "| configuration | params | grads | optimizer | activations | comm |"
echo "|---|---|---|---|---|---|"
for row in "${categories[@]}"; do echo "$row"; done
exit $status
