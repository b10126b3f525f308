#!/usr/bin/env bash
# mtrun test 3: two nodes x two ranks; rank 3 (node 1) exits with code 3 -> both mtrun exit 3,
# node 0's naming the remote rank; every process of the job is gone.
. "$(dirname "$0")/mtrun_lib.sh"

port=$(free_port)
args=(--nnodes 2 --nproc_per_node 2 --master_port "$port" --rdzv_id cross_$$)
prog=("$WORKER" --fail 3:3:1000 --sleep 60 --child --marker "$MARKER")
start_bg node0 "$MTRUN" "${args[@]}" --node_rank 0 "${prog[@]}"
start_bg node1 "$MTRUN" "${args[@]}" --node_rank 1 "${prog[@]}"
wait_rc "$PID_node1" 40
rc1=$RC
wait_rc "$PID_node0" 40
rc0=$RC
line="mtrun: rank 3 (node 1, local rank 1) exited with code 3; stopping the job"
check "node 1 exits 3 (got $rc1)" test "$rc1" = 3
check "node 0 exits 3 too (got $rc0)" test "$rc0" = 3
check "node 1 names the failure" has_line "$TMP/node1.err" "$line"
check "node 0 names the remote failure" has_line "$TMP/node0.err" "$line"
check "every process of the job is gone within 10 s" no_leftovers 10
[ "$FAILURES" = 0 ] || { show node0; show node1; }

# The other way round: a rank of node 0 fails, node 1 follows.
port=$(free_port)
args=(--nnodes 2 --nproc_per_node 2 --master_port "$port" --rdzv_id cross2_$$)
prog=("$WORKER" --fail 0:4:1000 --sleep 60 --marker "$MARKER")
start_bg b_node1 "$MTRUN" "${args[@]}" --node_rank 1 "${prog[@]}"
start_bg b_node0 "$MTRUN" "${args[@]}" --node_rank 0 "${prog[@]}"
wait_rc "$PID_b_node1" 40
rc1=$RC
wait_rc "$PID_b_node0" 40
rc0=$RC
line="mtrun: rank 0 (node 0, local rank 0) exited with code 4; stopping the job"
check "node 0 failure: node 0 exits 4 (got $rc0)" test "$rc0" = 4
check "node 0 failure: node 1 exits 4 (got $rc1)" test "$rc1" = 4
check "node 0 failure: node 1 names it" has_line "$TMP/b_node1.err" "$line"
check "node 0 failure: everything gone" no_leftovers 10
[ "$FAILURES" = 0 ] || { show b_node0; show b_node1; }
finish
