#!/usr/bin/env bash
# Host transport start-up checks, through mtrun as a user would:
#   - where the kernel refuses pidfd_getfd between the ranks of a host (played by
#     MT_TEST_PIDFD_GETFD_FAIL=EPERM, which refuses both the start-up probe and every later
#     mapping), the shared-memory path is turned off with one warning and the collectives on
#     device buffers (which would take that path) still pass, through UCX;
#   - a tuning variable out of range (MT_COMM_WINDOW=4294967296, which once wrapped to a window
#     of 0 and hung every collective) stops every rank at start with a message naming it.
# Usage: comm_env_fallback.sh MTRUN TEST_COLLECTIVES
set -u
MTRUN=$1
PROG=$2
TMP_PREFIX=comm_env
. "$(dirname "$0")/../lib.sh"
export MT_TIMEOUT_S=60

MT_TEST_PIDFD_GETFD_FAIL=EPERM "$MTRUN" --standalone --nproc_per_node 2 "$PROG" --device-buffers \
    --max-bytes 4194304 --max-bytes-bf16 1048576 >"$TMP/refused.out" 2>"$TMP/refused.err"
rc=$?
check "pidfd_getfd refused: the collectives pass (rc $rc)" test "$rc" = 0
n=$(grep -c "the kernel refuses to pass file descriptors between the ranks of this host" "$TMP/refused.err")
check "pidfd_getfd refused: one warning (got $n)" test "$n" = 1
check "pidfd_getfd refused: the warning names the cause" \
    grep -q "pidfd_getfd(pid [0-9]*): Operation not permitted (MT_TEST_PIDFD_GETFD_FAIL)" "$TMP/refused.err"
[ "$FAILURES" = 0 ] || { tail -20 "$TMP/refused.out"; tail -20 "$TMP/refused.err"; }

"$MTRUN" --standalone --nproc_per_node 2 "$PROG" --device-buffers --max-bytes 1048576 \
    --max-bytes-bf16 65536 >"$TMP/allowed.out" 2>"$TMP/allowed.err"
rc=$?
check "pidfd_getfd allowed: the collectives pass (rc $rc)" test "$rc" = 0
check "pidfd_getfd allowed: no warning" bash -c "! grep -q 'refuses to pass file descriptors' '$TMP/allowed.err'"

MT_COMM_WINDOW=4294967296 timeout 60 "$MTRUN" --standalone --nproc_per_node 2 "$PROG" \
    --max-bytes 65536 >"$TMP/window.out" 2>"$TMP/window.err"
rc=$?
check "MT_COMM_WINDOW=4294967296: the job fails at once (rc $rc)" bash -c "[ $rc != 0 ] && [ $rc != 124 ]"
check "MT_COMM_WINDOW=4294967296: the message names variable, value and range" \
    grep -q "MT_COMM_WINDOW=4294967296 is not an integer in 1..4096 (chunks in flight per direction)" "$TMP/window.err"
[ "$FAILURES" = 0 ] || { tail -5 "$TMP/window.err"; }
finish
