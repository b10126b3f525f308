#!/usr/bin/env bash
# Activation recompute: step time and activation peak of train_gpt with
# --activation-checkpointing full (and every:2) against none, one table:
#   bench/recompute.sh BUILD_DIR [NPROC [train_gpt options...]]
# Each mode runs ROUNDS times (default 3), the modes interleaved so that a busy machine slows
# them alike; a mode's step time is the minimum and the median over its runs' steps after the
# first two (warm-up). Exits non-zero when a run fails or full's minimum step time is above 1.4x
# none's (the goal of issue 16). Default model: 4 layers, d_model 128, 4 heads, seq 128, batch 4.
set -u
BUILD=${1:?usage: recompute.sh BUILD_DIR [NPROC [train_gpt options...]]}
NPROC=${2:-1}
shift $(($# >= 2 ? 2 : 1))
MODEL=(--layers 4 --d-model 128 --heads 4 --seq 128 --batch 4 --steps 12)
[ $# -gt 0 ] && MODEL=("$@")
ROUNDS=${ROUNDS:-3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/bench_recompute.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
MODES=(none every:2 full)
for r in $(seq "$ROUNDS"); do
    for m in "${MODES[@]}"; do
        if ! "$BUILD/bin/mtrun" --standalone --nproc_per_node "$NPROC" "$BUILD/bin/train_gpt" \
            "${MODEL[@]}" --activation-checkpointing "$m" --metrics "$TMP/${m/:/}.$r.jsonl" \
            >"$TMP/out" 2>&1; then
            echo "$m (round $r) failed:" >&2
            cat "$TMP/out" >&2
            exit 1
        fi
    done
done
echo "train_gpt ${MODEL[*]} on $NPROC rank(s), $ROUNDS runs per mode"
python3 - "$TMP" "${MODES[@]}" <<'EOF'
import glob, json, statistics, sys
tmp, modes = sys.argv[1], sys.argv[2:]
rows = {}
for m in modes:
    ms, act, losses = [], None, None
    for path in sorted(glob.glob(f"{tmp}/{m.replace(':', '')}.*.jsonl")):
        steps = [json.loads(l) for l in open(path) if '"loss"' in l]
        ms += [s["step_ms"] for s in steps[2:]]
        act = steps[-1]["peak_bytes"]["activations"]
        losses = [s["loss"] for s in steps]
    rows[m] = (min(ms), statistics.median(ms), act, losses)
base = rows["none"]
print(f"{'mode':<10} {'min ms':>9} {'median ms':>10} {'x none':>7} {'act peak':>12} {'x none':>7}  losses")
for m in modes:
    lo, med, act, losses = rows[m]
    same = "equal" if losses == base[3] else "DIFFER"
    print(f"{m:<10} {lo:>9.1f} {med:>10.1f} {lo / base[0]:>7.2f} {act:>12} {act / base[2]:>7.2f}  {same}")
ratio = rows["full"][0] / base[0]
bad = ratio > 1.4 or any(rows[m][3] != base[3] for m in modes)
sys.exit(1 if bad else 0)
EOF
