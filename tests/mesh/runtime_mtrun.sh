#!/usr/bin/env bash
# mt_init under mtrun: the launcher hosts the store; local ranks and nodes come from host
# identities. Two mtrun on this machine are two "nodes".
source "$(dirname "$0")/runtime_lib.sh"
MTRUN=$2

PORT=$(free_port)
start_bg one "$MTRUN" --nproc_per_node 3 --master_port "$PORT" --rdzv_id mtjob "$PROG"
expect_rc one 0 60
for r in 0 1 2; do
    expect_text one out "rank=$r world=3 local_rank=$r local_world=3 node=0 nodes=1"
    expect_text one out "rank=$r allreduce ok"
done
expect_text one out "job=mtjob"

PORT=$(free_port)
NODES=(--nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$PORT" --rdzv_id two)
start_bg n1 "$MTRUN" "${NODES[@]}" --node_rank 1 "$PROG"
start_bg n0 "$MTRUN" "${NODES[@]}" --node_rank 0 "$PROG"
expect_rc n0 0 60
expect_rc n1 0 60
HOST=$(hostname)
expect_text n0 out "rank=0 world=4 local_rank=0 local_world=2 node=0 nodes=2 host=$HOST/0"
expect_text n0 out "rank=1 world=4 local_rank=1 local_world=2 node=0 nodes=2 host=$HOST/0"
expect_text n1 out "rank=2 world=4 local_rank=0 local_world=2 node=1 nodes=2 host=$HOST/1"
expect_text n1 out "rank=3 world=4 local_rank=1 local_world=2 node=1 nodes=2 host=$HOST/1"

# torchrun's c10d rendezvous: the identical command line on both nodes, node ranks in arrival
# order (c0 starts 1 s before c1), and the ranks' allreduce crosses the two nodes.
PORT=$(free_port)
SAME=(--nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$PORT"
      --rdzv-id c10d_same "$PROG")
start_bg c0 "$MTRUN" "${SAME[@]}"
sleep 1
start_bg c1 "$MTRUN" "${SAME[@]}"
expect_rc c0 0 60
expect_rc c1 0 60
for r in 0 1 2 3; do
    node=$((r / 2))
    expect_text "c$node" out "rank=$r world=4 local_rank=$((r % 2)) local_world=2 node=$node nodes=2 host=$HOST/$node"
    expect_text "c$node" out "rank=$r allreduce ok"
done
finish
