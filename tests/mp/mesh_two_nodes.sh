#!/usr/bin/env bash
# Two mtrun on 127.0.0.1 (--nnodes 2, 2 ranks each) with UCX_TLS=tcp,self:
#  - {dp, tp} = {2, 2}: the tp groups are the ranks of one node, the dp groups cross nodes;
#  - {tp, dp} = {2, 2} puts tp across the nodes: refused on every rank, naming
#    MT_ALLOW_CROSS_HOST_TP=1, and accepted with it.
# usage: mesh_two_nodes.sh MTRUN TEST_MESH
set -u
mtrun=$1
prog=$2
export UCX_TLS=tcp,self UCX_NET_DEVICES=lo MT_TIMEOUT_S=${MT_TIMEOUT_S:-30}
status=0

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

out=$(mktemp)
trap 'rm -f "$out" "$out".*' EXIT

# run_pair NAME ARGS...: both nodes run test_mesh ARGS; RC0/RC1 get their exit codes and
# $out.0/$out.1 their output
run_pair() {
    local name=$1 port
    shift
    port=$(free_port)
    local common=(--nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port"
                  --rdzv_id "mesh-$name-$port")
    "$mtrun" "${common[@]}" --node_rank 0 "$prog" "$@" >"$out.0" 2>&1 &
    local p0=$!
    "$mtrun" "${common[@]}" --node_rank 1 "$prog" "$@" >"$out.1" 2>&1 &
    local p1=$!
    wait "$p0"; RC0=$?
    wait "$p1"; RC1=$?
    echo "== $name: node 0 exited $RC0, node 1 exited $RC1"
}

expect_ok() {
    if [ "$RC0" -ne 0 ] || [ "$RC1" -ne 0 ]; then
        echo "FAIL: expected both nodes to succeed" >&2
        tail -n 20 "$out.0" "$out.1" >&2
        status=1
    fi
}

# expect_refused TEXT...: both nodes exit non-zero and each one's output has every TEXT
expect_refused() {
    local ok=1
    [ "$RC0" -ne 0 ] && [ "$RC1" -ne 0 ] || ok=0
    for text in "$@"; do
        grep -qF -- "$text" "$out.0" && grep -qF -- "$text" "$out.1" || ok=0
    done
    if [ $ok -eq 1 ]; then
        echo "ok: refused: $(grep -F -- "$1" "$out.0" | head -n 1)"
    else
        echo "FAIL: expected both nodes to fail with: $*" >&2
        tail -n 20 "$out.0" "$out.1" >&2
        status=1
    fi
}

run_pair dp-tp --shape 2x2 --names dp,tp --flatten world
expect_ok
grep -h "checked" "$out.0" "$out.1"
run_pair tp-across --shape 2x2 --names tp,dp
expect_refused "would span hosts" "MT_ALLOW_CROSS_HOST_TP=1"
MT_ALLOW_CROSS_HOST_TP=1 run_pair tp-across-allowed --shape 2x2 --names tp,dp
expect_ok
exit $status
