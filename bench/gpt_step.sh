#!/usr/bin/env bash
# The GPT step's ops, communication and engine overhead at 1, 2 and 4 ranks, one table:
#   bench/gpt_step.sh BUILD_DIR [mt-bench-gpt-step options...]
# Default: the GPT of issue 20's table (12 layers x 768, 12 heads, vocab 256, seq 64, global
# batch 4, f32). Each rank count runs RUNS times (default 3), the rank counts interleaved so that
# a busy machine slows them alike; every figure is the median over the runs of the benchmark's
# own medians. RANKS overrides the rank counts ("1 2 4"). VARIANTS compares option sets in the
# same minutes: "A|B" (e.g. "--mapped-gather 1|--mapped-gather 0") runs each rank count with
# each set in turn, within every run, and prints one table per set.
set -u
BUILD=${1:?usage: gpt_step.sh BUILD_DIR [mt-bench-gpt-step options...]}
shift
RUNS=${RUNS:-3}
RANKS=${RANKS:-"1 2 4"}
IFS='|' read -r -a SETS <<<"${VARIANTS:-}"
[ ${#SETS[@]} -gt 0 ] || SETS=("")
TMP=$(mktemp -d "${TMPDIR:-/tmp}/bench_gpt_step.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
LOAD="$(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$RUNS"); do
    for n in $RANKS; do
        for v in "${!SETS[@]}"; do
            read -r -a extra <<<"${SETS[$v]}"
            if ! "$BUILD/bin/mtrun" --standalone --nproc_per_node "$n" \
                "$BUILD/bin/mt-bench-gpt-step" --json "$@" "${extra[@]}" \
                >"$TMP/$v.$n.$r.json" 2>"$TMP/err"; then
                echo "$n rank(s) (run $r, ${SETS[$v]:-no extra options}) failed:" >&2
                cat "$TMP/err" >&2
                exit 1
            fi
        done
    done
done
for v in "${!SETS[@]}"; do
echo "mt-bench-gpt-step $* ${SETS[$v]} ($RUNS runs per rank count, medians; load at start: $LOAD)"
python3 - "$TMP" "$v" $RANKS <<'PY'
import glob, json, statistics, sys
tmp, v, ranks = sys.argv[1], sys.argv[2], sys.argv[3:]
cols = ["threads", "ops_ms", "comm_ms", "step_ms", "exposed_comm_ms", "overhead_ms",
        "overhead_pct", "step_cpu_ms", "overhead_cpu_ms", "overhead_cpu_pct",
        "step_comm_thread_cpu_ms", "comm_thread_cpu_pct", "engine_cpu_ms", "engine_cpu_pct",
        "step_page_faults", "model_gflops", "gemm_gflops_total", "of_peak"]
print("| ranks | threads/rank | ops ms | comm ms | step ms | exposed comm ms | overhead ms "
      "| overhead % | CPU step ms | CPU step - ops ms | CPU % | comm thread CPU ms "
      "| comm thread CPU % | engine CPU ms | engine CPU % | step page faults | GFLOP/s "
      "| sgemm GFLOP/s | of peak |")
print("|---" * 19 + "|")
for n in ranks:
    runs = [json.loads(line.split(":", 1)[1]) for p in sorted(glob.glob(f"{tmp}/{v}.{n}.*.json"))
            for line in open(p) if line.startswith("[rank0]:{")]
    m = {c: statistics.median(r[c] for r in runs) for c in cols}
    print(f"| {n} | {m['threads']:.0f} | {m['ops_ms']:.1f} | {m['comm_ms']:.1f} "
          f"| {m['step_ms']:.1f} | {m['exposed_comm_ms']:.1f} | {m['overhead_ms']:.1f} "
          f"| {m['overhead_pct']:.1f} | {m['step_cpu_ms']:.1f} | {m['overhead_cpu_ms']:.1f} "
          f"| {m['overhead_cpu_pct']:.1f} | {m['step_comm_thread_cpu_ms']:.1f} "
          f"| {m['comm_thread_cpu_pct']:.1f} | {m['engine_cpu_ms']:.1f} "
          f"| {m['engine_cpu_pct']:.1f} | {m['step_page_faults']:.0f} "
          f"| {m['model_gflops']:.1f} | {m['gemm_gflops_total']:.1f} "
          f"| {100 * m['of_peak']:.1f}% |")
PY
done
