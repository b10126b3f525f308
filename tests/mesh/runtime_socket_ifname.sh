#!/usr/bin/env bash
# MT_SOCKET_IFNAME: the store listens on that interface only and UCX is pointed at it; an
# interface that does not exist is a clear error, from mtrun and from mt_init started by hand.
source "$(dirname "$0")/runtime_lib.sh"
MTRUN=$2

# Through mtrun on the loopback interface, two nodes: store bound to 127.0.0.1, UCX over lo.
PORT=$(free_port)
NODES=(--nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port "$PORT")
start_bg n0 env MT_SOCKET_IFNAME=lo UCX_TLS=tcp,self "$MTRUN" "${NODES[@]}" --node_rank 0 "$PROG"
start_bg n1 env MT_SOCKET_IFNAME=lo UCX_TLS=tcp,self "$MTRUN" "${NODES[@]}" --node_rank 1 "$PROG"
expect_rc n0 0 60
expect_rc n1 0 60
expect_text n0 out "rank=0 allreduce ok"
expect_text n1 out "rank=1 allreduce ok"

# An interface that does not exist: mtrun says so and exits 2 before starting anything.
PORT=$(free_port)
start_bg bad env MT_SOCKET_IFNAME=nosuch9 "$MTRUN" --nproc_per_node 1 --master_port "$PORT" "$PROG"
expect_rc bad nonzero 20
expect_text bad err "MT_SOCKET_IFNAME=nosuch9: no such interface"
expect_text bad err "lo"

# Started by hand, rank 0 hosts the store: the same error from mt_init.
PORT=$(free_port)
start hand RANK=0 WORLD_SIZE=1 MASTER_PORT="$PORT" MT_SOCKET_IFNAME=nosuch9
expect_rc hand nonzero 20
expect_text hand err "MT_SOCKET_IFNAME=nosuch9: no such interface"
finish
