#!/usr/bin/env bash
# mtrun test 2: 4 ranks, rank 1 exits with code 3 after 1 s while the others sleep, each with a
# child process; rank 2 and its child ignore SIGTERM (so SIGKILL after the grace period is
# needed). mtrun exits 3 with the exact line, and no process of the job is left within 10 s.
. "$(dirname "$0")/mtrun_lib.sh"

export MT_KILL_GRACE_S=1
start_bg job "$MTRUN" --standalone --nproc_per_node 4 \
    "$WORKER" --fail 1:3:1000 --sleep 60 --child --marker "$MARKER"
wait_rc "$PID_job" 30
check "mtrun exits with the failed rank's code 3 (got $RC)" test "$RC" = 3
check "the first failure is named exactly" \
    has_line "$TMP/job.err" "mtrun: rank 1 (node 0, local rank 1) exited with code 3; stopping the job"
check "only one failure line" test "$(grep -c 'stopping the job' "$TMP/job.err")" = 1
check "rank 1's last words were forwarded" has_line "$TMP/job.out" "[rank1]:failing rank=1 code=3"
check "every rank and child of the job is gone within 10 s" no_leftovers 10
[ "$FAILURES" = 0 ] || show job

# The same with ranks that ignore SIGTERM: SIGKILL after MT_KILL_GRACE_S reaches them and their
# children too.
start_bg stubborn "$MTRUN" --standalone --nproc_per_node 3 \
    "$WORKER" --ignore-term --fail 0:5:1000 --sleep 60 --child --marker "$MARKER"
wait_rc "$PID_stubborn" 30
check "SIGTERM-ignoring job: exit code 5 (got $RC)" test "$RC" = 5
check "SIGTERM-ignoring job: failure named" \
    has_line "$TMP/stubborn.err" "mtrun: rank 0 (node 0, local rank 0) exited with code 5; stopping the job"
check "SIGTERM-ignoring job: everything gone within 10 s" no_leftovers 10
[ "$FAILURES" = 0 ] || show stubborn

# All ranks succeed: exit 0, no failure line.
start_bg good "$MTRUN" --standalone --nproc_per_node 3 "$WORKER" --marker "$MARKER"
wait_rc "$PID_good" 30
check "successful job exits 0 (got $RC)" test "$RC" = 0
check "successful job prints no failure" bash -c "! grep -q 'stopping the job' '$TMP/good.err'"
finish
