#!/usr/bin/env bash
# Offload staging bandwidth beside ucx_perftest's, in one run: mt-bench-offload (host tier <->
# device memory through mt_stage_copy_async/mt_stage_wait, and memcpy) for 64 KiB .. 256 MiB,
# then ucx_perftest in loopback mode (-l: one process, an endpoint to its own worker, as the
# stager's) with the same memory types (-m host,host on the CPU device; cuda,host and host,cuda
# on a GPU with a CUDA-enabled UCX): ucp_get (the operation the stager posts) and ucp_put_bw.
# ucx_perftest reports MB/s meaning MiB/s; converted to GB/s (1e9 bytes/s) here. Best of 3.
# usage: bench/offload_perftest.sh [BUILD_DIR]   (default: build; MT_DEVICE=cpu for the CPU device)
set -euo pipefail
build=${1:-build}
bench=$build/bin/mt-bench-offload
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (Debian package ucx-utils)" >&2; exit 1; }
mem=${MT_PERFTEST_MEM:-host,host}

perftest() { # test size iterations -> GB/s, best of 3
    local best=0 gbs
    for _ in 1 2 3; do
        gbs=$(ucx_perftest -l -t "$1" -m "$mem" -s "$2" -n "$3" 2>/dev/null |
              awk '/^Final:/ {printf "%.3f\n", $7 * 1048576 / 1e9}')
        best=$(python3 -c "print(max($best, ${gbs:-0}))")
    done
    echo "$best"
}

echo "# mt-bench-offload ($bench), then ucx_perftest -l -m $mem; GB/s"
printf '%-10s %9s %9s %9s %12s %12s\n' bytes h2d d2h memcpy perf_get perf_put_bw
"$bench" --min-bytes 64KiB --max-bytes 256MiB --overlap-bytes 0 | while read -r line; do
    bytes=$(sed 's/.*bytes=\([0-9]*\).*/\1/' <<<"$line")
    iters=$((1073741824 / bytes)); [ "$iters" -ge 4 ] || iters=4
    read -r h2d d2h plain < <(awk '{for (i = 2; i <= 4; i++) {split($i, kv, "="); printf "%s ", kv[2]} print ""}' <<<"$line")
    printf '%-10s %9s %9s %9s %12s %12s\n' "$bytes" "$h2d" "$d2h" "$plain" \
        "$(perftest ucp_get "$bytes" "$iters")" "$(perftest ucp_put_bw "$bytes" "$iters")"
done
