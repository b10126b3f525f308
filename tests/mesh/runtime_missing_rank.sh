#!/usr/bin/env bash
# Ranks that never arrive: the others give up after MT_TIMEOUT_S naming who is missing.
source "$(dirname "$0")/runtime_lib.sh"

PORT=$(free_port)
COMMON=(WORLD_SIZE=3 MASTER_PORT=$PORT MT_TIMEOUT_S=5)
start r0 RANK=0 "${COMMON[@]}"
start r1 RANK=1 "${COMMON[@]}"
for r in 0 1; do
    expect_rc r$r nonzero 30
    expect_text r$r err "barrier 'init' timed out after 5 s: rank 2 of 3 never arrived"
done

# Rank 0, the store host, never starts: the client says whom it could not reach.
PORT=$(free_port)
start lone RANK=1 WORLD_SIZE=2 MASTER_PORT=$PORT MT_TIMEOUT_S=3
expect_rc lone nonzero 30
expect_text lone err "could not connect to the store at 127.0.0.1:$PORT within 3 s"

# A process of another job is refused at once; the job's own rank times out naming it.
PORT=$(free_port)
COMMON=(WORLD_SIZE=2 MASTER_PORT=$PORT MT_TIMEOUT_S=5)
start j0 RANK=0 MT_RDZV_ID=jobA "${COMMON[@]}"
start j1 RANK=1 MT_RDZV_ID=jobB "${COMMON[@]}"
expect_rc j1 nonzero 30
expect_text j1 err "belongs to job 'jobA', this process is in job 'jobB'"
expect_rc j0 nonzero 30
expect_text j0 err "rank 1 of 2 never arrived"
finish
