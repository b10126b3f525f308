#!/usr/bin/env bash
# One command for a GPU machine (issue 7): builds meshtrain with CUDA into build-gpu, runs every
# ctest test labelled `gpu`, prints the live mt-topo report next to `nvidia-smi topo -m`, trains
# a few train_gpt steps on --device cuda and --device cpu with the same seed, and ends with a
# summary. Without a GPU it says so and exits 0 (MT_GPU_RUN_ANYWAY=1 builds and runs anyway; the
# GPU tests then report skipped).
#   usage: tests/gpu/run.sh [build dir, default <repo>/build-gpu]
# Exit status: the number of failed sections (0 = all passed or skipped).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
STEPS=${MT_GPU_TRAIN_STEPS:-20}
# train_gpt's CUDA path needs every op on the GPU; until those are in, a failed CUDA run is
# reported, not counted. Set to 1 once the CUDA ops land.
TRAIN_GPT_CUDA_REQUIRED=${MT_GPU_TRAIN_REQUIRED:-0}
LOG=$BUILD/gpu-run-logs

summary=()
failed=0
note() { summary+=("$1"); }
fail() { summary+=("FAIL  $1"); failed=$((failed + 1)); }

print_summary() {
    echo
    echo "==== tests/gpu/run.sh summary ===="
    for line in "${summary[@]}"; do echo "  $line"; done
    echo "  failed sections: $failed (logs in $LOG)"
}

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
if [ "$gpus" -eq 0 ] && [ "${MT_GPU_RUN_ANYWAY:-0}" != 1 ]; then
    echo "tests/gpu/run.sh: no NVIDIA GPU on this machine (nvidia-smi missing or lists none);" \
         "nothing to run. MT_GPU_RUN_ANYWAY=1 builds and runs the GPU tests anyway (they skip)."
    exit 0
fi
mkdir -p "$LOG"
echo "tests/gpu/run.sh: $gpus GPU(s); building into $BUILD"
[ "$gpus" -gt 0 ] && nvidia-smi --query-gpu=index,name,memory.total,driver_version \
    --format=csv,noheader 2>/dev/null | sed 's/^/  /'

# ---- build ----------------------------------------------------------------------------------
if cmake -S "$ROOT" -B "$BUILD" -DMT_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$LOG/configure.log" 2>&1 &&
   cmake --build "$BUILD" -j "$JOBS" >"$LOG/build.log" 2>&1; then
    note "PASS  build with CUDA ($(grep -o 'CUDA backend [A-Z]*, NCCL [A-Z]*' "$LOG/configure.log" | head -1))"
else
    tail -n 30 "$LOG/configure.log" "$LOG/build.log" 2>/dev/null
    fail "build with CUDA (see $LOG/build.log)"
    print_summary
    exit "$failed"
fi

# ---- ctest -L gpu ---------------------------------------------------------------------------
(cd "$BUILD" && ctest -L gpu --output-on-failure) 2>&1 | tee "$LOG/ctest-gpu.log"
ctest_rc=${PIPESTATUS[0]}
counts=$(grep -E 'tests passed|tests failed' "$LOG/ctest-gpu.log" | tail -1)
skipped=$(grep -c '(Skipped)' "$LOG/ctest-gpu.log" || true)
if [ "$ctest_rc" -eq 0 ]; then
    note "PASS  ctest -L gpu: ${counts:-no tests} ($skipped skipped)"
else
    fail "ctest -L gpu: ${counts:-ctest failed} ($skipped skipped)"
fi

# ---- topology: mt-topo next to nvidia-smi ---------------------------------------------------
echo; echo "==== mt-topo (live) ===="
if "$BUILD/bin/mt-topo" 2>&1 | tee "$LOG/mt-topo.txt"; then
    note "PASS  mt-topo ran (compare with nvidia-smi topo -m above the summary)"
else
    fail "mt-topo (see $LOG/mt-topo.txt)"
fi
echo; echo "==== nvidia-smi topo -m ===="
nvidia-smi topo -m 2>&1 | tee "$LOG/nvidia-smi-topo.txt" || note "SKIP  nvidia-smi topo -m failed"
"$BUILD/bin/mt-topo" --export-nccl "$LOG/mt-topo-nccl.xml" >/dev/null 2>&1 &&
    note "INFO  mt-topo --export-nccl wrote $LOG/mt-topo-nccl.xml (for NCCL_TOPO_FILE)"

# ---- train_gpt: cuda against cpu, same seed -------------------------------------------------
train() { # device, metrics file
    (cd "$LOG" && "$BUILD/bin/train_gpt" --device "$1" --steps "$STEPS" --seed 1 --metrics "$2") \
        >"$LOG/train_gpt_$1.log" 2>&1
}
loss_of() { grep -o '"loss": [-0-9.eE+]*' "$1" | sed 's/"loss": //'; }
if [ "$gpus" -eq 0 ]; then
    note "SKIP  train_gpt --device cuda vs cpu: no GPU"
elif ! train cpu "$LOG/train_cpu.json"; then
    fail "train_gpt --device cpu (see $LOG/train_gpt_cpu.log)"
elif ! train cuda "$LOG/train_cuda.json"; then
    why=$(tail -n 1 "$LOG/train_gpt_cuda.log")
    if [ "$TRAIN_GPT_CUDA_REQUIRED" = 1 ]; then
        fail "train_gpt --device cuda: $why"
    else
        note "TODO  train_gpt --device cuda does not run yet (CUDA ops not all in): $why"
    fi
else
    # Same seed and data: the losses agree to a loose tolerance (fp32 on the CPU, cuBLAS on the
    # GPU sums in another order).
    if paste <(loss_of "$LOG/train_cpu.json") <(loss_of "$LOG/train_cuda.json") | awk '
        { d = $1 - $2; if (d < 0) d = -d; if (d > 2e-2 * ($1 < 0 ? -$1 : $1) + 1e-3) bad++; n++ }
        END { printf "  %d steps compared, %d differ by more than 2%%\n", n, bad; exit (n == 0 || bad) }'; then
        last=$(loss_of "$LOG/train_cuda.json" | tail -1)
        tps=$(grep -o '"tokens_per_s": [0-9.]*' "$LOG/train_cuda.json" | tail -1 | sed 's/.*: //')
        note "PASS  train_gpt cuda vs cpu, $STEPS steps: losses agree (last $last, cuda $tps tokens/s)"
    else
        fail "train_gpt cuda vs cpu: losses differ (see $LOG/train_cpu.json, train_cuda.json)"
    fi
fi

print_summary
exit "$failed"
