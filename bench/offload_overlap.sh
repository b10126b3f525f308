#!/usr/bin/env bash
# Step time of train_gpt --offload optimizer with the overlapped optimizer step (--offload-overlap,
# --clip 0) against the plain step with clipping off (--clip 0) and on (--clip 1, where the
# overlap is refused: the step waits for the global norm). docs/offload.md, docs/benchmarks.md.
# Runs alternate so that all three see the same load.
# usage: bench/offload_overlap.sh BUILD_DIR [REPS] [RANKS...]
#   e.g. bench/offload_overlap.sh build 3 1 2
# Prints per run the median step time of steps 2..19 (the first two warm up), then per rank
# count and mode the median and the minimum over runs, and the ratio of each to clip0.
set -eu
BUILD=$1
REPS=${2:-5}
shift $(($# < 2 ? $# : 2))
RANKS=("$@")
[ ${#RANKS[@]} -gt 0 ] || RANKS=(1 2)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/offload_overlap.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export MT_DEVICE=cpu
MODEL=(--layers 4 --d-model 256 --heads 8 --seq 64 --batch 8 --steps 20 --offload optimizer)
for np in "${RANKS[@]}"; do
    for rep in $(seq "$REPS"); do
        for m in clip0 overlap clip1; do
            case $m in
            clip0) extra=(--clip 0) ;;
            overlap) extra=(--clip 0 --offload-overlap) ;;
            clip1) extra=(--clip 1) ;;
            esac
            "$BUILD/bin/mtrun" --standalone --nproc_per_node "$np" "$BUILD/bin/train_gpt" \
                "${MODEL[@]}" "${extra[@]}" --metrics "$TMP/$np.$m.$rep.jsonl" >/dev/null
        done
    done
done
python3 - "$TMP" "$REPS" "${RANKS[@]}" <<'PY'
import json, statistics, sys
tmp, reps, ranks = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
modes = ("clip0", "overlap", "clip1")
for np in ranks:
    res = {}
    for m in modes:
        med = []
        for rep in range(1, reps + 1):
            rows = [json.loads(l) for l in open(f"{tmp}/{np}.{m}.{rep}.jsonl")][2:]
            med.append(statistics.median(r["step_ms"] for r in rows))
        res[m] = med
        print(f"{np} rank(s) {m:8s} per run: " + " ".join(f"{x:.1f}" for x in med) + " ms")
    for what, f in (("median", statistics.median), ("min", min)):
        base = f(res["clip0"])
        print(f"{np} rank(s) {what} over runs: " +
              ", ".join(f"{m} {f(res[m]):.1f} ms ({f(res[m]) / base:.2f}x)" for m in modes))
PY
