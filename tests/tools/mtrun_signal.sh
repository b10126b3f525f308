#!/usr/bin/env bash
# mtrun test 4: a rank killed by a signal -> mtrun exits 128 + signal, naming it.
. "$(dirname "$0")/mtrun_lib.sh"

start_bg kill9 "$MTRUN" --standalone --nproc_per_node 2 \
    "$WORKER" --signal 1:9:500 --sleep 60 --marker "$MARKER"
wait_rc "$PID_kill9" 30
check "SIGKILLed rank: exit 137 (got $RC)" test "$RC" = 137
check "SIGKILLed rank: message" has_line "$TMP/kill9.err" \
    "mtrun: rank 1 (node 0, local rank 1) was killed by signal 9 (SIGKILL); stopping the job"

start_bg segv "$MTRUN" --standalone --nproc_per_node 2 \
    "$WORKER" --signal 0:11:300 --sleep 60 --marker "$MARKER"
wait_rc "$PID_segv" 30
check "SIGSEGV rank: exit 139 (got $RC)" test "$RC" = 139
check "SIGSEGV rank: message" has_line "$TMP/segv.err" \
    "mtrun: rank 0 (node 0, local rank 0) was killed by signal 11 (SIGSEGV); stopping the job"
check "no leftovers" no_leftovers 10
[ "$FAILURES" = 0 ] || { show kill9; show segv; }
finish
