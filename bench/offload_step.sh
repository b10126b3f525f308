#!/usr/bin/env bash
# Step time of train_gpt with --offload optimizer against --offload none (docs/offload.md,
# docs/benchmarks.md), on the ranks given, runs alternating so that both see the same load.
# usage: bench/offload_step.sh BUILD_DIR [REPS] [RANKS...]   e.g. bench/offload_step.sh build 5 1 4
# Prints per run the median step time of steps 2..19 (the first two warm up), then per rank
# count and policy the median and the minimum over runs, and the ratio optimizer / none of each.
set -eu
BUILD=$1
REPS=${2:-5}
shift $(($# < 2 ? $# : 2))
RANKS=("$@")
[ ${#RANKS[@]} -gt 0 ] || RANKS=(1 4)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/offload_step.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export MT_DEVICE=cpu
MODEL=(--layers 4 --d-model 256 --heads 8 --seq 64 --batch 8 --steps 20)
for np in "${RANKS[@]}"; do
    for rep in $(seq "$REPS"); do
        for m in none optimizer; do
            "$BUILD/bin/mtrun" --standalone --nproc_per_node "$np" "$BUILD/bin/train_gpt" \
                "${MODEL[@]}" --offload "$m" --metrics "$TMP/$np.$m.$rep.jsonl" >/dev/null
        done
    done
done
python3 - "$TMP" "$REPS" "${RANKS[@]}" <<'PY'
import json, statistics, sys
tmp, reps, ranks = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for np in ranks:
    res = {}
    for m in ("none", "optimizer"):
        med = []
        for rep in range(1, reps + 1):
            rows = [json.loads(l) for l in open(f"{tmp}/{np}.{m}.{rep}.jsonl")][2:]
            med.append(statistics.median(r["step_ms"] for r in rows))
        res[m] = med
        print(f"{np} rank(s) {m:9s} per run: " + " ".join(f"{x:.1f}" for x in med) + " ms")
    for what, f in (("median", statistics.median), ("min", min)):
        a, b = f(res["none"]), f(res["optimizer"])
        print(f"{np} rank(s) {what} over runs: none {a:.1f} ms, optimizer {b:.1f} ms, ratio {b / a:.2f}")
PY
