#!/usr/bin/env bash
# mtrun test 7: SIGTERM (and SIGINT) sent to mtrun is forwarded to the ranks, everything stops,
# mtrun exits 128 + signal; on a two-node job the other node stops too.
. "$(dirname "$0")/mtrun_lib.sh"

start_bg term "$MTRUN" --standalone --nproc_per_node 2 "$WORKER" --sleep 60 --child --marker "$MARKER"
check "ranks started" wait_for_text "$TMP/term.out" "[rank1]:started" 20
kill -TERM "$PID_term"
wait_rc "$PID_term" 20
check "SIGTERM: mtrun exits 143 (got $RC)" test "$RC" = 143
check "SIGTERM: says so" has_line "$TMP/term.err" "mtrun: node 0 received SIGTERM; stopping the job"
check "SIGTERM: ranks and children gone" no_leftovers 10
[ "$FAILURES" = 0 ] || show term

# Ranks that ignore SIGTERM are killed after the grace period; SIGINT is forwarded as SIGINT.
MT_KILL_GRACE_S=1 start_bg int "$MTRUN" --standalone --nproc_per_node 2 "$WORKER" --ignore-term --sleep 60 --marker "$MARKER"
check "ranks started" wait_for_text "$TMP/int.out" "[rank1]:started" 20
kill -INT "$PID_int"
wait_rc "$PID_int" 20
check "SIGINT: mtrun exits 130 (got $RC)" test "$RC" = 130
check "SIGINT: says so" has_line "$TMP/int.err" "mtrun: node 0 received SIGINT; stopping the job"
check "SIGINT: ranks gone" no_leftovers 10
[ "$FAILURES" = 0 ] || show int

# Two nodes: SIGTERM to node 1's mtrun stops node 0 as well, with the same code.
port=$(free_port)
args=(--nnodes 2 --nproc_per_node 1 --master_port "$port" --rdzv_id term_$$)
start_bg n0 "$MTRUN" "${args[@]}" --node_rank 0 "$WORKER" --sleep 60 --marker "$MARKER"
start_bg n1 "$MTRUN" "${args[@]}" --node_rank 1 "$WORKER" --sleep 60 --marker "$MARKER"
check "2 nodes: ranks started" wait_for_text "$TMP/n1.out" "[rank1]:started" 20
check "2 nodes: ranks started" wait_for_text "$TMP/n0.out" "[rank0]:started" 20
kill -TERM "$PID_n1"
wait_rc "$PID_n1" 20
rc1=$RC
wait_rc "$PID_n0" 20
rc0=$RC
check "2 nodes: node 1 exits 143 (got $rc1)" test "$rc1" = 143
check "2 nodes: node 0 exits 143 (got $rc0)" test "$rc0" = 143
check "2 nodes: node 0 names node 1's signal" has_line "$TMP/n0.err" "mtrun: node 1 received SIGTERM; stopping the job"
check "2 nodes: everything gone" no_leftovers 10
[ "$FAILURES" = 0 ] || { show n0; show n1; }
finish
