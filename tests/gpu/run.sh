#!/usr/bin/env bash
# One command for a GPU machine (issue 7): builds meshtrain with CUDA, runs every GPU test, checks
# NCCL, the topology report and training on the GPU, and ends with a summary.
#
#   tests/gpu/run.sh [build dir, default <repo>/build-gpu]
#
# Sections (each PASS, FAIL, SKIP with the reason, or INFO):
#   build        cmake -DMT_CUDA=ON, Release
#   ctest -L gpu every op on the GPU against the CPU (tolerances in each test), the device and
#                its caching allocator (the NCCL tests run below, with the right NCCL)
#   nccl         collectives on GPU buffers under mtrun: 1 rank; 2 ranks and the timeout check
#                when the machine has 2 GPUs, or one GPU and NCCL >= 2.30 (NCCL_MULTI_RANK_GPU_ENABLE=1):
#                MT_NCCL_LIB_DIR, else the nvidia-nccl-cu13 Python package when new enough
#   topology     live `mt-topo` against `nvidia-smi topo -m` and against NCCL's own dump
#                (NCCL_TOPO_DUMP_FILE); `mt-topo --export-nccl` fed back through NCCL_TOPO_FILE
#   ucx          the UCX the programs load (MT_UCX_ROOT, else the bundle's libucx-cu13 from
#                scripts/gpu-deps, else pkg-config's) and its transports (ucx_info -d)
#   offload      mt-bench-offload: the stager's path and bandwidth against cudaMemcpyAsync and
#                ucx_perftest -m cuda,host / host,cuda
#   train_gpt    --device cuda against --device cpu, same seed, MT_GPU_TRAIN_STEPS (20) steps,
#                losses within 2 %
#   gpt2-small   12 layers, d_model 768, 12 heads, seq 1024, bf16: tokens/s and MFU
#                (MT_GPU_GPT2_STEPS, default 10; MT_GPU_GPT2_BATCH, default 8)
# Without a GPU it says so and exits 0 (MT_GPU_RUN_ANYWAY=1 builds and runs anyway; the GPU
# tests then report skipped). When the machine lacks the Debian build dependencies, a bundle made
# with scripts/gpu-deps (.gpu-deps, carried along) is used. Logs: <build>/gpu-run-logs.
# Exit status: the number of failed sections (0 = all passed or skipped).
set -u
# A pipeline's status is its first failing command's: `prog | tee log` fails when prog does.
set -o pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
STEPS=${MT_GPU_TRAIN_STEPS:-20}
GPT2_STEPS=${MT_GPU_GPT2_STEPS:-10}
GPT2_BATCH=${MT_GPU_GPT2_BATCH:-8}
LOG=$BUILD/gpu-run-logs
export MT_TIMEOUT_S=${MT_TIMEOUT_S:-120}
# An outer bound on every program this script starts, for what MT_TIMEOUT_S does not cover (a
# hung driver call): exit 124 is then reported as a timeout.
LIMIT=${MT_GPU_RUN_LIMIT_S:-600}

summary=()
failed=0
note() { summary+=("$1"); echo ">> $1"; }
fail() { summary+=("FAIL  $1"); echo ">> FAIL  $1"; failed=$((failed + 1)); }

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
if [ -d "$ROOT/.gpu-deps" ]; then
    # shellcheck source=/dev/null
    . "$ROOT/scripts/gpu-deps-env"
    [ -n "${MT_GPU_DEPS_ROOT:-}" ] &&
        note "INFO  build dependencies from the bundle in .gpu-deps (scripts/gpu-deps)"
fi
echo "tests/gpu/run.sh: $gpus GPU(s); building into $BUILD"
[ "$gpus" -gt 0 ] && nvidia-smi --query-gpu=index,name,memory.total,driver_version \
    --format=csv,noheader 2>/dev/null | sed 's/^/  /'

# ---- build ----------------------------------------------------------------------------------
# NCCL: the toolkit's when it has one, else the nvidia-nccl-cu13 Python package's (MT_NCCL_ROOT
# wins over both).
nccl_root=${MT_NCCL_ROOT:-}
if [ -z "$nccl_root" ] && [ ! -e /usr/local/cuda/include/nccl.h ] && command -v python3 >/dev/null; then
    nccl_root=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
fi
cmake_nccl=()
if [ -n "$nccl_root" ]; then
    cmake_nccl=(-DMT_NCCL_ROOT="$nccl_root")
    export LD_LIBRARY_PATH="$nccl_root/lib:${LD_LIBRARY_PATH:-}"
    note "INFO  NCCL for the build from $nccl_root"
fi
# UCX: one with CUDA transports for the offload stager when there is one (MT_UCX_ROOT, else the
# bundle's libucx-cu13, MT_UCX_CUDA_ROOT from gpu-deps-env); else pkg-config's, and the stager
# copies with cudaMemcpyAsync.
ucx_root=${MT_UCX_ROOT:-${MT_UCX_CUDA_ROOT:-}}
cmake_ucx=()
if [ -n "$ucx_root" ]; then
    cmake_ucx=(-DMT_UCX_ROOT="$ucx_root")
    note "INFO  UCX for the build from $ucx_root"
fi
t0=$(date +%s)
if cmake -S "$ROOT" -B "$BUILD" -DMT_CUDA=ON -DCMAKE_BUILD_TYPE=Release "${cmake_nccl[@]}" "${cmake_ucx[@]}" >"$LOG/configure.log" 2>&1 &&
   cmake --build "$BUILD" -j "$JOBS" >"$LOG/build.log" 2>&1; then
    note "PASS  build with CUDA in $(( $(date +%s) - t0 )) s ($(grep -o 'CUDA backend [A-Z]*, NCCL [A-Z]*' "$LOG/configure.log" | head -1); $(grep -o 'UCX [0-9.]* from .*' "$LOG/configure.log" | head -1))"
else
    tail -n 30 "$LOG/configure.log" "$LOG/build.log" 2>/dev/null
    fail "build with CUDA (see $LOG/configure.log, $LOG/build.log)"
    print_summary
    exit "$failed"
fi
BIN=$BUILD/bin

# ---- UCX: the library the programs load and its transports ------------------------------------
# The ucx_info of the UCX built against (MT_UCX_ROOT's bin/, its lib/ first: the wheel's programs
# have no run path to it), else the system's.
ucx_lib=$(sed -n 's/^MT_UCX_ROOT:PATH=//p' "$BUILD/CMakeCache.txt" | head -1)
ucx_info_cmd=(ucx_info)
[ -n "$ucx_lib" ] && ucx_info_cmd=(env LD_LIBRARY_PATH="$ucx_lib/lib:${LD_LIBRARY_PATH:-}" "$ucx_lib/bin/ucx_info")
loaded_ucp=$(ldd "$BIN/mt-bench-offload" 2>/dev/null | awk '$1 == "libucp.so.0" {print $3}')
if "${ucx_info_cmd[@]}" -v >"$LOG/ucx-info.txt" 2>&1 && "${ucx_info_cmd[@]}" -d >>"$LOG/ucx-info.txt" 2>&1; then
    note "INFO  UCX $(sed -n 's/^# Library version: //p' "$LOG/ucx-info.txt" | head -1) ($loaded_ucp); transports: $(sed -n 's/^#  *Transport: //p' "$LOG/ucx-info.txt" | sort -u | paste -sd' ')"
else
    note "INFO  UCX: ${ucx_info_cmd[*]} failed (see $LOG/ucx-info.txt); programs load $loaded_ucp"
fi

# ---- ctest -L gpu (the NCCL tests run in the next section) ---------------------------------
(cd "$BUILD" && ctest -L gpu -E '^gpu_nccl' --output-on-failure --timeout "$LIMIT") 2>&1 |
    tee "$LOG/ctest-gpu.log"
ctest_rc=${PIPESTATUS[0]}
counts=$(grep -E 'tests passed|tests failed' "$LOG/ctest-gpu.log" | tail -1)
skipped=$(grep -c '(Skipped)' "$LOG/ctest-gpu.log" || true)
if [ "$ctest_rc" -eq 0 ] && [ "$gpus" -gt 0 ] && [ "$skipped" -gt 0 ]; then
    # The tests skip only when they find no GPU; nvidia-smi found one.
    fail "ctest -L gpu: $skipped test(s) skipped for want of a GPU, but nvidia-smi lists $gpus"
elif [ "$ctest_rc" -eq 0 ]; then
    note "PASS  ctest -L gpu: ${counts:-no tests} ($skipped skipped)"
else
    fail "ctest -L gpu: ${counts:-ctest failed} ($skipped skipped)"
fi

# ---- NCCL -----------------------------------------------------------------------------------
# The NCCL meshtrain was built with (the toolkit's header), and a newer one for several ranks on
# one GPU: MT_NCCL_LIB_DIR, else the nvidia-nccl-cu13 Python package's library.
nccl_h=$(sed -n 's/^MT_NCCL_INCLUDE:PATH=//p' "$BUILD/CMakeCache.txt" | head -1)
built_nccl=$(awk '/#define NCCL_MAJOR/ {ma=$3} /#define NCCL_MINOR/ {mi=$3} /#define NCCL_PATCH/ {p=$3}
                  END { if (ma != "") print ma "." mi "." p }' "${nccl_h:-/usr/local/cuda/include}/nccl.h" 2>/dev/null)
new_nccl_dir=${MT_NCCL_LIB_DIR:-}
new_nccl_ver=""
if [ -z "$new_nccl_dir" ] && command -v python3 >/dev/null; then
    new_nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
    new_nccl_ver=$(python3 -m pip show nvidia-nccl-cu13 2>/dev/null | awk '/^Version:/ {print $2}')
fi
at_least_2_30() { awk -v v="$1" 'BEGIN { split(v, a, "."); exit !(a[1] > 2 || (a[1] == 2 && a[2] >= 30)) }'; }
multi_env=()
multi_why=""
if [ "$gpus" -ge 2 ]; then
    multi_why="$gpus GPUs"
elif [ -n "$built_nccl" ] && at_least_2_30 "$built_nccl"; then
    multi_why="one GPU, NCCL $built_nccl (the build's)"
elif [ -n "${MT_NCCL_LIB_DIR:-}" ]; then
    multi_env=(LD_LIBRARY_PATH="$MT_NCCL_LIB_DIR:${LD_LIBRARY_PATH:-}")
    multi_why="one GPU, NCCL from MT_NCCL_LIB_DIR=$MT_NCCL_LIB_DIR"
elif [ -n "$new_nccl_dir" ] && [ -n "$new_nccl_ver" ] && at_least_2_30 "$new_nccl_ver"; then
    multi_env=(LD_LIBRARY_PATH="$new_nccl_dir:${LD_LIBRARY_PATH:-}")
    multi_why="one GPU, NCCL $new_nccl_ver from nvidia-nccl-cu13"
fi
note "INFO  NCCL: built with ${built_nccl:-unknown}; for several ranks: ${multi_why:-none ($gpus GPU(s) and no NCCL >= 2.30: nvidia-nccl-cu13 is ${new_nccl_ver:-absent})}"

nccl_test() { # log name, mtrun ranks, extra env..., -- program arguments...
    local name=$1 np=$2
    shift 2
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    env NCCL_DEBUG=${NCCL_DEBUG:-VERSION} "${envs[@]}" timeout -k 30 "$LIMIT" \
        "$BIN/mtrun" --standalone --nproc_per_node "$np" "$BUILD/tests/bin/test_gpu_nccl" "$@" \
        >"$LOG/$name.log" 2>&1
}
nccl_version() { grep -m1 -o 'NCCL version [0-9.]*' "$LOG/$1.log" | sed 's/NCCL version //'; }
nccl_result() { # rc, what, log name
    local ver
    ver=$(nccl_version "$3")
    if [ "$1" -eq 0 ]; then
        note "PASS  $2, NCCL ${ver:-?}: $(grep -ho '[0-9]* passed, [0-9]* failed' "$LOG/$3.log" | awk '{p += $1} END {print p " checks"}')$(grep -h 'busbw' "$LOG/$3.log" | sed 's/^/; /' | head -1)"
    elif [ "$1" -eq 77 ] && [ "$gpus" -gt 0 ]; then
        fail "$2: the test found no GPU, but nvidia-smi lists $gpus (see $LOG/$3.log)"
    elif [ "$1" -eq 77 ]; then
        note "SKIP  $2: no GPU"
    elif [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; then
        tail -n 20 "$LOG/$3.log"
        fail "$2: still running after $LIMIT s, killed (see $LOG/$3.log)"
    else
        tail -n 20 "$LOG/$3.log"
        fail "$2, NCCL ${ver:-?} (exit $1, see $LOG/$3.log)"
    fi
}
[ -x "$BUILD/tests/bin/test_gpu_nccl" ] || note "SKIP  NCCL tests: not built (no NCCL found at configure)"
if [ -x "$BUILD/tests/bin/test_gpu_nccl" ]; then
    nccl_test nccl-np1 1 NCCL_TOPO_DUMP_FILE="$LOG/nccl-topo-dump.xml" --
    nccl_result $? "NCCL collectives, 1 rank" nccl-np1
    if [ -n "$multi_why" ]; then
        nccl_test nccl-np2 2 NCCL_MULTI_RANK_GPU_ENABLE=1 "${multi_env[@]}" -- --bench-mib 256
        nccl_result $? "NCCL collectives, 2 ranks ($multi_why)" nccl-np2
        nccl_test nccl-timeout 2 NCCL_MULTI_RANK_GPU_ENABLE=1 "${multi_env[@]}" -- --timeout-check
        nccl_result $? "NCCL timeout names op and group, aborts ($multi_why)" nccl-timeout
    else
        note "SKIP  NCCL with 2 ranks and the timeout check: one GPU and no NCCL >= 2.30 (set MT_NCCL_LIB_DIR)"
    fi
fi

# ---- topology ---------------------------------------------------------------------------------
# agrees_with_live DUMP OUT: mt-topo's JSON report of the NCCL topology file DUMP (written next to
# it) agrees with the live report (compare_topo.py); their messages in OUT, the verdict last
agrees_with_live() {
    "$BIN/mt-topo" --input "$1" --json >"${1%.xml}.json" 2>"$2" &&
        python3 "$ROOT/tests/gpu/compare_topo.py" json "${1%.xml}.json" "$LOG/mt-topo.json" \
            >>"$2" 2>&1
}
echo; echo "==== mt-topo (live) ===="
if "$BIN/mt-topo" 2>&1 | tee "$LOG/mt-topo.txt" && "$BIN/mt-topo" --json >"$LOG/mt-topo.json" 2>>"$LOG/mt-topo.txt"; then
    echo; echo "==== nvidia-smi topo -m ===="
    nvidia-smi topo -m 2>&1 | tee "$LOG/nvidia-smi-topo.txt"
    have_py=0
    command -v python3 >/dev/null && have_py=1
    if [ "$gpus" -eq 0 ]; then
        note "SKIP  topology comparisons: no GPU"
        have_py=0
    elif [ "$have_py" = 0 ]; then
        note "SKIP  topology comparisons: no python3"
    elif python3 "$ROOT/tests/gpu/compare_topo.py" smi "$LOG/nvidia-smi-topo.txt" "$LOG/mt-topo.json" >"$LOG/compare-smi.txt" 2>&1; then
        note "PASS  mt-topo vs nvidia-smi topo -m: $(tail -n 1 "$LOG/compare-smi.txt")"
    else
        cat "$LOG/compare-smi.txt"
        fail "mt-topo vs nvidia-smi topo -m: $(tail -n 1 "$LOG/compare-smi.txt")"
    fi
    if [ "$have_py" = 1 ] && [ -s "$LOG/nccl-topo-dump.xml" ]; then
        if agrees_with_live "$LOG/nccl-topo-dump.xml" "$LOG/compare-dump.txt"; then
            note "PASS  mt-topo vs NCCL's own dump (NCCL_TOPO_DUMP_FILE): $(tail -n 1 "$LOG/compare-dump.txt")"
        else
            cat "$LOG/compare-dump.txt"
            fail "mt-topo vs NCCL's own dump: $(tail -n 1 "$LOG/compare-dump.txt")"
        fi
    elif [ "$have_py" = 1 ]; then
        note "SKIP  mt-topo vs NCCL's dump: NCCL wrote no $LOG/nccl-topo-dump.xml"
    fi
    # Our export, read by NCCL: the collectives must pass and NCCL's dump of what it read must
    # match the live report.
    if "$BIN/mt-topo" --export-nccl "$LOG/mt-topo-nccl.xml" >/dev/null 2>"$LOG/export.err" &&
       [ -x "$BUILD/tests/bin/test_gpu_nccl" ]; then
        nccl_test nccl-topo-file 1 NCCL_TOPO_FILE="$LOG/mt-topo-nccl.xml" NCCL_DEBUG=INFO \
            NCCL_DEBUG_SUBSYS=INIT,GRAPH NCCL_TOPO_DUMP_FILE="$LOG/nccl-topo-dump-from-export.xml" --
        rc=$?
        if [ "$rc" -eq 0 ] && [ "$have_py" = 1 ] && [ -s "$LOG/nccl-topo-dump-from-export.xml" ]; then
            # NCCL dumped what it read: that view must match the live report.
            if agrees_with_live "$LOG/nccl-topo-dump-from-export.xml" "$LOG/compare-export.txt"; then
                note "PASS  NCCL_TOPO_FILE=mt-topo --export-nccl: collectives pass, NCCL's view matches ($(tail -n 1 "$LOG/compare-export.txt"))"
            else
                cat "$LOG/compare-export.txt"
                fail "NCCL_TOPO_FILE=mt-topo --export-nccl: NCCL's view differs: $(tail -n 1 "$LOG/compare-export.txt")"
            fi
        elif [ "$rc" -eq 0 ]; then
            note "INFO  NCCL_TOPO_FILE=mt-topo --export-nccl: collectives pass; no comparison of NCCL's view (no python3, or NCCL wrote no $LOG/nccl-topo-dump-from-export.xml)"
        elif [ "$rc" -eq 77 ] && [ "$gpus" -eq 0 ]; then
            note "SKIP  NCCL_TOPO_FILE=mt-topo --export-nccl: no GPU"
        else
            grep -i 'warn\|topo' "$LOG/nccl-topo-file.log" | tail -n 20
            fail "NCCL_TOPO_FILE=mt-topo --export-nccl: exit $rc (see $LOG/nccl-topo-file.log)"
        fi
    else
        fail "mt-topo --export-nccl: $(tail -n 1 "$LOG/export.err")"
    fi
else
    fail "mt-topo (see $LOG/mt-topo.txt)"
fi

# ---- offload staging: the stager against cudaMemcpyAsync and ucx_perftest ---------------------
# mt-bench-offload on the GPU (host tier <-> device memory); the summary gives the stager's path
# (ucx with a UCX with CUDA transports, else device-copy) and the largest size's row.
if [ "$gpus" -gt 0 ]; then
    if timeout -k 30 "$LIMIT" "$BIN/mt-bench-offload" --min-bytes 1MiB --max-bytes 256MiB \
            --total 1GiB --reps 2 --overlap-bytes 64MiB >"$LOG/offload.txt" 2>&1; then
        cat "$LOG/offload.txt"
        note "PASS  offload staging ($(sed -n 's/^# mt-bench-offload: device cuda, //p' "$LOG/offload.txt" | head -1)), GB/s at 256 MiB: $(awk '$1 == 268435456 {printf "stage h2d %s d2h %s, cudaMemcpyAsync %s / %s, ucx_perftest %s / %s", $2, $3, $4, $5, $6, $7}' "$LOG/offload.txt")"
    else
        tail -n 20 "$LOG/offload.txt"
        fail "mt-bench-offload on the GPU: $(tail -n 1 "$LOG/offload.txt")"
    fi
fi

# ---- train_gpt: cuda against cpu, same seed -------------------------------------------------
train() { # device, metrics file
    (cd "$LOG" && timeout -k 30 "$LIMIT" "$BIN/train_gpt" --device "$1" --steps "$STEPS" \
        --seed 1 --metrics "$2") >"$LOG/train_gpt_$1.log" 2>&1
}
loss_of() { grep -o '"loss": [-0-9.eE+]*' "$1" | sed 's/"loss": //'; }
if [ "$gpus" -eq 0 ]; then
    note "SKIP  train_gpt --device cuda vs cpu: no GPU"
elif ! train cpu "$LOG/train_cpu.json"; then
    fail "train_gpt --device cpu: $(tail -n 1 "$LOG/train_gpt_cpu.log")"
elif ! train cuda "$LOG/train_cuda.json"; then
    tail -n 20 "$LOG/train_gpt_cuda.log"
    fail "train_gpt --device cuda: $(tail -n 1 "$LOG/train_gpt_cuda.log")"
else
    # Same seed and data: the losses agree to a loose tolerance (the GPU sums in another order).
    if paste <(loss_of "$LOG/train_cpu.json") <(loss_of "$LOG/train_cuda.json") | awk '
        { d = $1 - $2; if (d < 0) d = -d; if (d > 2e-2 * ($1 < 0 ? -$1 : $1) + 1e-3) bad++; n++
          if (d > worst) worst = d }
        END { printf "  %d steps compared, %d differ by more than 2%%, largest difference %.2e\n", n, bad, worst
              exit (n == 0 || bad) }' | tee "$LOG/train-compare.txt"; then
        last=$(loss_of "$LOG/train_cuda.json" | tail -1)
        note "PASS  train_gpt cuda vs cpu, $STEPS steps: losses agree ($(sed 's/^ *//' "$LOG/train-compare.txt"); last $last)"
    else
        fail "train_gpt cuda vs cpu: losses differ (see $LOG/train_cpu.json, train_cuda.json)"
    fi
fi

# ---- GPT-2 small on the GPU: tokens/s and MFU ------------------------------------------------
if [ "$gpus" -gt 0 ]; then
    if (cd "$LOG" && timeout -k 30 "$LIMIT" "$BIN/train_gpt" --device cuda --layers 12 \
            --d-model 768 --heads 12 \
            --seq 1024 --batch "$GPT2_BATCH" --param-dtype bf16 --steps "$GPT2_STEPS" \
            --metrics "$LOG/gpt2_small.json") >"$LOG/gpt2_small.log" 2>&1; then
        grep -E 'FLOP per token|throughput|parameters' "$LOG/gpt2_small.log"
        note "PASS  GPT-2 small (12 x 768, 12 heads, seq 1024, batch $GPT2_BATCH, bf16), $GPT2_STEPS steps: $(grep -h '^throughput' "$LOG/gpt2_small.log" | sed 's/^throughput //')"
    else
        tail -n 20 "$LOG/gpt2_small.log"
        fail "GPT-2 small on the GPU: $(tail -n 1 "$LOG/gpt2_small.log")"
    fi
fi

print_summary
exit "$failed"
