#!/usr/bin/env bash
# Side by side, in one run: all_gather and reduce_scatter bus bandwidth at 64 MiB with 2 local
# ranks (mt-bench-comm under mtrun) against ucx_perftest -t tag_bw -s 67108864 between two local
# processes. Best of 3 runs each. ucx_perftest reports MB/s meaning MiB/s; converted to GB/s
# (1e9 bytes/s) here. Target: busbw >= 80% of ucx_perftest. Also measured: the raw both-ways
# cma ceiling (mt-bench-cma), the bound for any collective that copies in both directions.
# usage: bench/compare_ucx_perftest.sh [BUILD_DIR]   (default: build)
set -euo pipefail
build=${1:-build}
mtrun=$build/bin/mtrun
bench=$build/bin/mt-bench-comm
cma=$build/bin/mt-bench-cma
size=67108864
runs=3
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (Debian package ucx-utils)" >&2; exit 1; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

perftest_once() {
    local port
    port=$(free_port)
    ucx_perftest -t tag_bw -s $size -n 40 -p "$port" >/dev/null 2>&1 &
    local server=$!
    sleep 1
    # "Final:" line: the 6th number is the overall bandwidth in MiB/s.
    ucx_perftest 127.0.0.1 -p "$port" -t tag_bw -s $size -n 40 2>/dev/null |
        awk '/^Final:/ {printf "%.4f\n", $7 * 1048576 / 1e9}'
    wait "$server" || true
}

bench_once() {
    local op=$1
    "$mtrun" --standalone --nproc_per_node 2 "$bench" --op "$op" --min-bytes $size \
        --max-bytes $size --iters 40 --warmup 5 --json 2>/dev/null |
        sed 's/^\[rank[0-9]*\]://' | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["busbw_gbs"])'
}

best() { sort -g | tail -1; }

cma_both() { "$cma" --bytes $((size / 2)) --iters 40 | awk '/both ways/ {print $(NF-3)}'; }

ref=$(for i in $(seq $runs); do perftest_once; done | best)
echo "ucx_perftest tag_bw 64 MiB (one direction): best of $runs = $ref GB/s"
# A 2-rank all_gather/reduce_scatter copies 32 MiB each way at the same time; the machine's raw
# ceiling for that (process_vm_readv both ways, no UCX) is the second reference.
both=$(for i in $(seq $runs); do cma_both; done | best)
echo "raw cma both ways, 32 MiB per direction: best of $runs = $both GB/s per direction"
status=0
for op in all_gather reduce_scatter; do
    bw=$(for i in $(seq $runs); do bench_once "$op"; done | best)
    pct=$(python3 -c "print(f'{100 * $bw / $ref:.0f}')")
    pct_both=$(python3 -c "print(f'{100 * $bw / $both:.0f}')")
    echo "mt-bench-comm $op 64 MiB, 2 ranks: best of $runs busbw = $bw GB/s" \
         "= $pct% of ucx_perftest, $pct_both% of raw cma both ways"
    [ "$pct" -ge 80 ] || status=1
done
# Exit status: the target, busbw >= 80% of ucx_perftest for both operations.
exit $status
