#!/usr/bin/env bash
# mt_init without a launcher: nothing set (a single process hosting its own store), then three
# ranks started by hand in reverse order (clients before the store host: they retry).
source "$(dirname "$0")/runtime_lib.sh"

start single
expect_rc single 0 30
expect_text single out "rank=0 world=1 local_rank=0 local_world=1 node=0 nodes=1"
expect_text single out "job=none"
expect_text single out "rank=0 allreduce ok"

PORT=$(free_port)
COMMON=(WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT MT_RDZV_ID=byhand MT_TIMEOUT_S=30)
start r2 RANK=2 "${COMMON[@]}"
start r1 RANK=1 "${COMMON[@]}"
sleep 0.5
start r0 RANK=0 "${COMMON[@]}"
for r in 0 1 2; do
    expect_rc r$r 0 60
    expect_text r$r out "rank=$r world=3 local_rank=$r local_world=3 node=0 nodes=1"
    expect_text r$r out "job=byhand"
    expect_text r$r out "rank=$r allreduce ok"
done
finish
