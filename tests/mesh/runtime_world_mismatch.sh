#!/usr/bin/env bash
# Join checks that fail on one rank stop every rank within seconds (MT_TIMEOUT_S is 60: exiting
# well before it shows that the failure was shared, not waited out), each with a clear message.
source "$(dirname "$0")/runtime_lib.sh"

# One rank says WORLD_SIZE=4 where the others say 3. It starts last so that the others are
# already waiting for it.
PORT=$(free_port)
COMMON=(MASTER_PORT=$PORT MT_TIMEOUT_S=60)
start r0 RANK=0 WORLD_SIZE=3 "${COMMON[@]}"
start r2 RANK=2 WORLD_SIZE=3 "${COMMON[@]}"
sleep 2
start r1 RANK=1 WORLD_SIZE=4 "${COMMON[@]}"
for r in 0 1 2; do expect_rc r$r nonzero 20; done
# Ranks 0 and 2 agree; whichever recorded the world size first is named.
expect_text r1 err "world size mismatch: rank 1 has WORLD_SIZE=4, but rank "
expect_text r1 err " joined with WORLD_SIZE=3"
for r in 0 2; do
    expect_text r$r err "another process failed"
    expect_text r$r err "world size mismatch"
done

# LOCAL_RANK that disagrees with the host identities (both ranks run on this host).
PORT=$(free_port)
COMMON=(WORLD_SIZE=2 MASTER_PORT=$PORT MT_TIMEOUT_S=60)
start l0 RANK=0 "${COMMON[@]}"
start l1 RANK=1 LOCAL_RANK=0 "${COMMON[@]}"
for r in 0 1; do expect_rc l$r nonzero 20; done
expect_text l1 err "LOCAL_RANK=0 disagrees with host identities: rank 1 is local rank 1"
expect_text l0 err "LOCAL_RANK=0 disagrees"

# The same rank started twice.
PORT=$(free_port)
COMMON=(WORLD_SIZE=3 MASTER_PORT=$PORT MT_TIMEOUT_S=60)
start d0 RANK=0 "${COMMON[@]}"
start d1 RANK=1 "${COMMON[@]}"
sleep 2
start d1b RANK=1 "${COMMON[@]}"
for r in d0 d1 d1b; do expect_rc $r nonzero 20; done
expect_text d1b err "duplicate rank: RANK=1 is claimed by this process"
expect_text d0 err "duplicate rank"

# A malformed variable is named with its value.
start bad RANK=x WORLD_SIZE=2
expect_rc bad nonzero 10
expect_text bad err "RANK='x' is not an integer"
finish
