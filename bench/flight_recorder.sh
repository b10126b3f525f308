#!/usr/bin/env bash
# The flight recorder's cost (docs/flight-recorder.md) on small collectives, where a fixed cost
# per collective weighs most: mt-bench-comm's all_reduce, all_gather and reduce_scatter of
# 64 B .. 4 KiB on NPROC ranks, with the recorder on (MT_FLIGHT_RECORDER=2048, the default) and
# off (0), the two interleaved ROUNDS times (default 5) so that a busy machine slows them alike:
#   bench/flight_recorder.sh BUILD_DIR [NPROC]
# Per (op, size) it prints the median time of each over the rounds and on/off - 1, then the median
# of those ratios over all (op, size) pairs. Exits non-zero when a run fails, or when that median
# is above 1% (the goal of issue 19).
set -u
BUILD=${1:?usage: flight_recorder.sh BUILD_DIR [NPROC]}
NPROC=${2:-2}
ROUNDS=${ROUNDS:-5}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/bench_fr.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
for r in $(seq "$ROUNDS"); do
    for n in 2048 0; do
        if ! MT_FLIGHT_RECORDER=$n "$BUILD/bin/mtrun" --standalone --nproc_per_node "$NPROC" \
            "$BUILD/bin/mt-bench-comm" --op all --min-bytes 64 --max-bytes 4KiB --iters 2000 \
            --warmup 200 --json >"$TMP/$n.$r.out" 2>"$TMP/err"; then
            echo "MT_FLIGHT_RECORDER=$n (round $r) failed:" >&2
            cat "$TMP/err" >&2
            exit 1
        fi
    done
done
python3 - "$TMP" "$ROUNDS" "$NPROC" <<'PY'
import json, statistics, sys
tmp, rounds, nproc = sys.argv[1], int(sys.argv[2]), sys.argv[3]
times = {}
for n in ("2048", "0"):
    for r in range(1, rounds + 1):
        for line in open(f"{tmp}/{n}.{r}.out"):
            line = line.split("]:", 1)[-1].strip()
            if not line.startswith("{"):
                continue
            o = json.loads(line)
            times.setdefault((o["op"], o["bytes"]), {}).setdefault(n, []).append(o["time_us"])
print(f"mt-bench-comm on {nproc} ranks, {rounds} interleaved runs each, median time per op (us)")
print(f"{'op':<15}{'bytes':>7}{'on':>10}{'off':>10}{'on/off-1':>10}")
ratios = []
for (op, b), t in sorted(times.items()):
    on, off = statistics.median(t["2048"]), statistics.median(t["0"])
    ratios.append(on / off - 1)
    print(f"{op:<15}{b:>7}{on:>10.2f}{off:>10.2f}{100 * (on / off - 1):>9.2f}%")
m = statistics.median(ratios)
print(f"median over {len(ratios)} (op, size): {100 * m:+.2f}%")
sys.exit(0 if m <= 0.01 else 1)
PY
