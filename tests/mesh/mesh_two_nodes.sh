#!/usr/bin/env bash
# Two mtrun on 127.0.0.1 (--nnodes 2, 2 ranks each) with UCX_TLS=tcp,self:
#  - {dp, tp} = {2, 2}: the tp groups are the ranks of one node, the dp groups cross nodes;
#  - {tp, dp} = {2, 2} puts tp across the nodes: refused on every rank, naming
#    MT_ALLOW_CROSS_HOST_TP=1, and accepted with it.
# usage: mesh_two_nodes.sh MTRUN TEST_MESH
set -u
MTRUN=$1
PROG=$2
TMP_PREFIX=mesh_two_nodes
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export UCX_TLS=tcp,self UCX_NET_DEVICES=lo MT_TIMEOUT_S=${MT_TIMEOUT_S:-30}
# Each pair ends within MT_TIMEOUT_S of its rendezvous; past this it is reported as hung.
LIMIT=$((MT_TIMEOUT_S * 2))

# run_pair NAME WANT ARGS...: both nodes run test_mesh ARGS (output in $TMP/NAME_node0 and
# NAME_node1 .out/.err) and must exit as WANT says: 0 or nonzero
run_pair() {
    local name=$1 want=$2 port
    shift 2
    port=$(free_port)
    start_node "${name}_node0" 0 "$port" "$PROG" "$@"
    start_node "${name}_node1" 1 "$port" "$PROG" "$@"
    expect_rc "${name}_node0" "$want" "$LIMIT"
    expect_rc "${name}_node1" "$want" "$LIMIT"
}

# says NAME TEXT: NAME's output (stdout or stderr) contains TEXT
says() {
    if grep -qF -- "$2" "$TMP/$1.out" "$TMP/$1.err"; then
        pass "$1 says '$2'"
    else
        fail "$1 does not say '$2'"
        show "$1"
    fi
}

run_pair dp_tp 0 --shape 2x2 --names dp,tp --flatten world
says dp_tp_node0 "checked"
run_pair tp_across nonzero --shape 2x2 --names tp,dp
for node in 0 1; do
    says tp_across_node$node "would span hosts"
    says tp_across_node$node "MT_ALLOW_CROSS_HOST_TP=1"
done
MT_ALLOW_CROSS_HOST_TP=1 run_pair tp_across_allowed 0 --shape 2x2 --names tp,dp
finish
