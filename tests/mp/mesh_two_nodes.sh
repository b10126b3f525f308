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

# run_pair NAME ARGS...: both nodes run test_mesh ARGS; succeeds when both exit 0
run_pair() {
    local name=$1 port
    shift
    port=$(free_port)
    local common=(--nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port"
                  --rdzv_id "mesh-$name-$port")
    "$mtrun" "${common[@]}" --node_rank 0 "$prog" "$@" &
    local p0=$!
    "$mtrun" "${common[@]}" --node_rank 1 "$prog" "$@" &
    local p1=$!
    wait "$p0"; local rc0=$?
    wait "$p1"; local rc1=$?
    echo "== $name: node 0 exited $rc0, node 1 exited $rc1"
    [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ]
}

run_pair dp-tp --shape 2x2 --names dp,tp --flatten world || status=1
run_pair tp-across --shape 2x2 --names tp,dp \
    --expect-error "would span hosts" || status=1
run_pair tp-across-names-override --shape 2x2 --names tp,dp \
    --expect-error "MT_ALLOW_CROSS_HOST_TP=1" || status=1
MT_ALLOW_CROSS_HOST_TP=1 run_pair tp-across-allowed --shape 2x2 --names tp,dp || status=1
exit $status
