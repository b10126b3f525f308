#!/usr/bin/env bash
# mtrun test 6 and rendezvous mistakes: a node that never starts, a node 0 that never starts,
# nodes that disagree on --nproc_per_node, two mtrun claiming the same --node_rank.
. "$(dirname "$0")/mtrun_lib.sh"
export MT_TIMEOUT_S=3
SLACK=6

port=$(free_port)
start_bg alone0 "$MTRUN" --nnodes 2 --node_rank 0 --master_port "$port" --rdzv_id miss_$$ \
    "$WORKER" --marker "$MARKER"
wait_rc "$PID_alone0" $((MT_TIMEOUT_S + SLACK))
check "node 1 never started: node 0 exits non-zero in time (got $RC)" \
    bash -c "[ '$RC' != timeout ] && [ '$RC' != 0 ]"
check "node 1 never started: node 0 names node 1" \
    grep -qE "^mtrun: node 1 never joined job 'miss_$$' within 3 s" "$TMP/alone0.err"
check "node 1 never started: no rank was started" bash -c "! grep -q started '$TMP/alone0.out'"
[ "$FAILURES" = 0 ] || show alone0

port=$(free_port)
start_bg alone1 "$MTRUN" --nnodes 2 --node_rank 1 --master_port "$port" --rdzv_id miss_$$ \
    "$WORKER" --marker "$MARKER"
wait_rc "$PID_alone1" $((MT_TIMEOUT_S + SLACK))
check "node 0 never started: node 1 exits non-zero in time (got $RC)" \
    bash -c "[ '$RC' != timeout ] && [ '$RC' != 0 ]"
check "node 0 never started: node 1 says it cannot reach the store" \
    grep -qF "mtrun: node 1 could not reach the rendezvous store at 127.0.0.1:$port within 3 s" "$TMP/alone1.err"
[ "$FAILURES" = 0 ] || show alone1

port=$(free_port)
start_bg mis0 "$MTRUN" --nnodes 2 --nproc_per_node 2 --node_rank 0 --master_port "$port" \
    "$WORKER" --marker "$MARKER"
sleep 0.3
start_bg mis1 "$MTRUN" --nnodes 2 --nproc_per_node 1 --node_rank 1 --master_port "$port" \
    "$WORKER" --marker "$MARKER"
wait_rc "$PID_mis1" $((MT_TIMEOUT_S + SLACK))
rc1=$RC
wait_rc "$PID_mis0" $((MT_TIMEOUT_S + SLACK))
rc0=$RC
msg="node 1 was started with --nnodes 2 --nproc_per_node 1 but node 0 with --nnodes 2 --nproc_per_node 2"
check "mismatch: node 1 exits non-zero (got $rc1)" bash -c "[ '$rc1' != timeout ] && [ '$rc1' != 0 ]"
check "mismatch: node 0 exits non-zero (got $rc0)" bash -c "[ '$rc0' != timeout ] && [ '$rc0' != 0 ]"
check "mismatch: node 1 explains" grep -qF "mtrun: $msg" "$TMP/mis1.err"
check "mismatch: node 0 explains" grep -qF "mtrun: $msg" "$TMP/mis0.err"
[ "$FAILURES" = 0 ] || { show mis0; show mis1; }

port=$(free_port)
args=(--nnodes 2 --node_rank 1 --master_port "$port" --rdzv_id dup_$$)
start_bg dup0 "$MTRUN" --nnodes 2 --node_rank 0 --master_port "$port" --rdzv_id dup_$$ \
    "$WORKER" --sleep 3 --marker "$MARKER"
start_bg dup1 "$MTRUN" "${args[@]}" "$WORKER" --sleep 3 --marker "$MARKER"
check "duplicate: first node 1 runs" wait_for_text "$TMP/dup1.out" "[rank1]:started" 20
start_bg dup1b "$MTRUN" "${args[@]}" "$WORKER" --sleep 3 --marker "$MARKER"
wait_rc "$PID_dup1b" 10
check "duplicate: second node 1 exits 1 (got $RC)" test "$RC" = 1
check "duplicate: it says node rank 1 is taken" \
    grep -qE "^mtrun: node rank 1 of job 'dup_$$' is already taken by mtrun pid $PID_dup1 on host " "$TMP/dup1b.err"
wait_rc "$PID_dup0" 20
check "duplicate: the real job still succeeds (node 0 got $RC)" test "$RC" = 0
wait_rc "$PID_dup1" 20
check "duplicate: the real job still succeeds (node 1 got $RC)" test "$RC" = 0
[ "$FAILURES" = 0 ] || { show dup0; show dup1; show dup1b; }

# Another job's mtrun on the same port is refused.
port=$(free_port)
start_bg j0 "$MTRUN" --nnodes 2 --node_rank 0 --master_port "$port" --rdzv_id jobA_$$ \
    "$WORKER" --marker "$MARKER"
sleep 0.3
start_bg j1 "$MTRUN" --nnodes 2 --node_rank 1 --master_port "$port" --rdzv_id jobB_$$ \
    "$WORKER" --marker "$MARKER"
wait_rc "$PID_j1" $((MT_TIMEOUT_S + SLACK))
check "wrong job id: node 1 exits non-zero (got $RC)" bash -c "[ '$RC' != timeout ] && [ '$RC' != 0 ]"
check "wrong job id: the message names the store" grep -qF "mtrun: node 1 cannot join the rendezvous store at 127.0.0.1:$port" "$TMP/j1.err"
wait_rc "$PID_j0" $((MT_TIMEOUT_S + SLACK))
[ "$FAILURES" = 0 ] || { show j0; show j1; }
check "no leftovers" no_leftovers 10
finish
