#!/usr/bin/env bash
# Offload staging bandwidth beside ucx_perftest's, in one run: mt-bench-offload for 64 KiB ..
# 256 MiB, no overlap line. The program itself runs the references with the same memory types:
# the plain copy (memcpy, or cudaMemcpyAsync on a GPU) and ucx_perftest -l -t ucp_get (-m
# host,host on the CPU device; cuda,host and host,cuda on a GPU), with the ucx_perftest of the UCX
# it loaded (bin/ beside an MT_UCX_ROOT's lib/, else PATH's). GB/s = 1e9 bytes/s, best of 3.
# usage: bench/offload_perftest.sh [BUILD_DIR] [mt-bench-offload options, e.g. --json]
#        (default: build; MT_DEVICE=cpu for the CPU device)
set -euo pipefail
build=${1:-build}
[ $# -gt 0 ] && shift
exec "$build/bin/mt-bench-offload" --min-bytes 64KiB --max-bytes 256MiB --overlap-bytes 0 "$@"
