#!/usr/bin/env bash
# mt_init without a launcher: nothing set (a single process hosting its own store), then three
# ranks started by hand in reverse order (clients before the store host: they retry). Without
# MT_STORE_TOKEN rank 0 warns that its loopback store is open to this host's users.
source "$(dirname "$0")/runtime_lib.sh"
unset MT_STORE_TOKEN

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
expect_text r0 err "without MT_STORE_TOKEN: anyone who reaches that port can join"

# The same on a host declared single (MT_NNODES=1): the store is on loopback, still open to the
# host's other users, and rank 0 says so.
PORT=$(free_port)
ONE=(WORLD_SIZE=2 MT_NNODES=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT MT_RDZV_ID=byhand MT_TIMEOUT_S=30)
start s1 RANK=1 "${ONE[@]}"
start s0 RANK=0 "${ONE[@]}"
for r in 0 1; do expect_rc s$r 0 60; done
expect_text s0 err "(loopback) without MT_STORE_TOKEN: any local user can join, read or stop the job"
if grep -qF "without MT_STORE_TOKEN" "$TMP/single.err"; then
    fail "a single process warns about a store token it drew itself"
else
    pass "a single process does not warn about the store token"
fi
finish
