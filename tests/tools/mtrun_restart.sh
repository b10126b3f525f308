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

# Node 1 may not restart (its own --max_restarts 0) and ends; node 0 does not wait for it in the
# next round (join timeout 60 s): node 1 said why it ends.
port=$(free_port)
start_node gone1 1 "$port" --max_restarts 0 "$WORKER" --fail 3:4:300 --sleep 60 --marker "$MARKER"
start_node gone0 0 "$port" --max_restarts 1 --rdzv_conf join_timeout=60 \
    "$WORKER" --fail 3:4:300 --sleep 60 --marker "$MARKER"
expect_rc gone1 nonzero 30
check "node without restarts: exit code 4 (got $RC)" test "$RC" = 4
expect_rc gone0 nonzero 20
check "waiting node: exits with code 4 (got $RC)" test "$RC" = 4
check "waiting node: names the node that does not restart, and why" has_line "$TMP/gone0.err" \
    "mtrun: node 1 does not take part in restart 1 of job 'two-nodes-$port': it has no restart left (--max_restarts 0); stopping the job"
check "no restart: nothing left within 10 s" no_leftovers 10
[ "$FAILURES" = 0 ] || { show gone0; show gone1; }
finish
