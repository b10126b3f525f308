#!/usr/bin/env bash
# mtrun test: --max_restarts. A rank that fails ends the round on every node; while restarts are
# left every rank starts again with TORCHELASTIC_RESTART_COUNT = the round; once they are spent
# (or with --max_restarts 0) the job fails naming the last failure, non-zero on every node, and
# nothing of it is left running. A node that ends instead of entering the next round says so, and
# the others stop at once naming it and why. (train_gpt_restart shows a restarted training resuming exactly.)
. "$(dirname "$0")/mtrun_lib.sh"

export MT_KILL_GRACE_S=1

# restart_counts NAME RANK: the TORCHELASTIC_RESTART_COUNT values RANK printed, in order
restart_counts() {
    grep -F "[rank$2]:env TORCHELASTIC_RESTART_COUNT=" "$TMP/$1.out" | sed 's/.*=//' | tr '\n' ' '
}

# --max_restarts 0: the first failure ends the job, as without the option.
start_bg none "$MTRUN" --standalone --nproc_per_node 2 --max_restarts 0 \
    "$WORKER" --fail 1:3:300 --sleep 60 --child --marker "$MARKER"
expect_rc none nonzero 30
check "--max_restarts 0: exit code 3 (got $RC)" test "$RC" = 3
check "--max_restarts 0: the failure is named" \
    has_line "$TMP/none.err" "mtrun: rank 1 (node 0, local rank 1) exited with code 3; stopping the job"
check "--max_restarts 0: no restart" bash -c "! grep -q 'restart' '$TMP/none.err'"
check "--max_restarts 0: nothing left within 10 s" no_leftovers 10

# One node, 2 restarts of a rank that always fails: 3 rounds, then the last failure is named.
start_bg one "$MTRUN" --standalone --nproc_per_node 2 --max_restarts 2 \
    "$WORKER" --env --fail 1:3:300 --sleep 60 --child --marker "$MARKER"
expect_rc one nonzero 60
check "one node, spent restarts: exit code 3 (got $RC)" test "$RC" = 3
check "one node: rank 0 ran in rounds 0, 1, 2 ($(restart_counts one 0))" \
    test "$(restart_counts one 0)" = "0 1 2 "
check "one node: TORCHELASTIC_MAX_RESTARTS=2" \
    has_line "$TMP/one.out" "[rank1]:env TORCHELASTIC_MAX_RESTARTS=2"
for k in 1 2; do
    check "one node: restart $k announced" has_line "$TMP/one.err" \
        "mtrun: restarting every rank (restart $k of 2, --max_restarts) after: rank 1 (node 0, local rank 1) exited with code 3"
done
check "one node: the job gives up naming the last failure" has_line "$TMP/one.err" \
    "mtrun: giving up after 2 restarts (--max_restarts 2); the last failure: rank 1 (node 0, local rank 1) exited with code 3"
check "one node: nothing left within 10 s" no_leftovers 10
[ "$FAILURES" = 0 ] || show one

# Two nodes, a rank of node 1 always fails: both nodes restart once, then both fail with its code.
port=$(free_port)
start_node two1 1 "$port" --max_restarts 1 "$WORKER" --env --fail 3:4:300 --sleep 60 --child --marker "$MARKER"
start_node two0 0 "$port" --max_restarts 1 "$WORKER" --env --fail 3:4:300 --sleep 60 --child --marker "$MARKER"
expect_rc two0 nonzero 60
check "two nodes: node 0 exits with rank 3's code 4 (got $RC)" test "$RC" = 4
expect_rc two1 nonzero 30
check "two nodes: node 1 exits with rank 3's code 4 (got $RC)" test "$RC" = 4
for n in two0 two1; do
    check "$n: restart announced" has_line "$TMP/$n.err" \
        "mtrun: restarting every rank (restart 1 of 1, --max_restarts) after: rank 3 (node 1, local rank 1) exited with code 4"
    check "$n: gives up naming the last failure" has_line "$TMP/$n.err" \
        "mtrun: giving up after 1 restart (--max_restarts 1); the last failure: rank 3 (node 1, local rank 1) exited with code 4"
done
check "two nodes: rank 0 ran in rounds 0, 1 ($(restart_counts two0 0))" \
    test "$(restart_counts two0 0)" = "0 1 "
check "two nodes: rank 2 ran in rounds 0, 1 ($(restart_counts two1 2))" \
    test "$(restart_counts two1 2)" = "0 1 "
check "two nodes: nothing left within 10 s" no_leftovers 10
[ "$FAILURES" = 0 ] || { show two0; show two1; }

# stuck_node NAME JOIN_TIMEOUT: rank 3 fails; node 1 (NAME1) stays stopping (its ranks ignore
# SIGTERM, 60 s grace) while node 0 (NAME0) restarts and waits for it in the next round.
stuck_node() {
    port=$(free_port)
    MT_KILL_GRACE_S=60 start_node "${1}1" 1 "$port" --max_restarts 1 \
        "$WORKER" --fail 3:4:300 --sleep 60 --ignore-term --marker "$MARKER"
    start_node "${1}0" 0 "$port" --max_restarts 1 --rdzv_conf join_timeout="$2" \
        "$WORKER" --fail 3:4:300 --sleep 60 --marker "$MARKER"
    check "$1: node 0 restarts" wait_for_text "$TMP/${1}0.err" \
        "mtrun: restarting every rank (restart 1 of 1, --max_restarts)" 30
}

# Node 1 ends instead of entering the next round without a word (its mtrun is killed while
# stopping): node 0 waits for it no longer than the join timeout, then names it.
stuck_node gone 3
kill -9 "$PID_gone1"
expect_rc gone1 nonzero 10
check "never joins: node 1's mtrun was killed (got $RC)" test "$RC" = 137
expect_rc gone0 nonzero 30
check "never joins: the waiting node exits 1 (got $RC)" test "$RC" = 1
check "never joins: the waiting node names the node that never came" has_line "$TMP/gone0.err" \
    "mtrun: node 1 never joined restart 1 of job 'two-nodes-$port' within 3 s (--rdzv_conf join_timeout); its mtrun has probably ended; stopping the job"
check "never joins: nothing left within 10 s" no_leftovers 10
[ "$FAILURES" = 0 ] || { show gone0; show gone1; }

# Node 1 gets SIGTERM while stopping its ranks after a failure, and ends instead of restarting: node 0 does not wait for it in the next round
# (join timeout 60 s), node 1 said why it ends.
stuck_node sig 60
kill -TERM "$PID_sig1" # while stopping: its ranks are killed now, and it does not restart
expect_rc sig1 nonzero 20
check "signaled node: exits with the round's code 4 (got $RC)" test "$RC" = 4
expect_rc sig0 nonzero 20
check "signaled node: the waiting node exits with code 4 (got $RC)" test "$RC" = 4
check "signaled node: the waiting node names it, and why" has_line "$TMP/sig0.err" \
    "mtrun: node 1 does not take part in restart 1 of job 'two-nodes-$port': it received SIGTERM; stopping the job"
check "signaled node: nothing left within 10 s" no_leftovers 10
[ "$FAILURES" = 0 ] || { show sig0; show sig1; }

# Nodes with different --max_restarts are refused before any rank starts.
port=$(free_port)
start_node mr0 0 "$port" --max_restarts 1 "$WORKER" --sleep 60 --marker "$MARKER"
sleep 0.3
start_node mr1 1 "$port" --max_restarts 0 "$WORKER" --sleep 60 --marker "$MARKER"
msg="node 1 was started with --max_restarts 0 but node 0 with --max_restarts 1; every node of job 'two-nodes-$port' needs the same value"
for n in mr0 mr1; do
    expect_rc $n nonzero 20
    check "--max_restarts mismatch: $n exits 1 (got $RC)" test "$RC" = 1
    check "--max_restarts mismatch: $n explains" has_line "$TMP/$n.err" "mtrun: $msg; stopping the job"
done
check "--max_restarts mismatch: no rank was started" bash -c "! grep -q started '$TMP/mr0.out' '$TMP/mr1.out'"
check "--max_restarts mismatch: nothing left within 10 s" no_leftovers 10
[ "$FAILURES" = 0 ] || { show mr0; show mr1; }
finish
