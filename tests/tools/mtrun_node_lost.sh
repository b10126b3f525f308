#!/usr/bin/env bash
# mtrun test 5: node 0's mtrun (the store host) killed with SIGKILL -> node 1 stops its ranks
# and exits non-zero within MT_TIMEOUT_S + slack. And node 1's mtrun killed -> node 0 notices
# the missing heartbeat and stops within MT_TIMEOUT_S + slack, naming node 1.
. "$(dirname "$0")/mtrun_lib.sh"
export MT_TIMEOUT_S=5
SLACK=6

# seconds_since T0: whole seconds elapsed since the `date +%s.%N` value T0
seconds_since() { awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN { printf "%d", t1 - t0 }'; }

# lose_node JOB KILLED NPROC: a two-node job of NPROC sleeping ranks per node; once they have all
# started, node KILLED's mtrun is SIGKILLed and the other one must exit non-zero within
# MT_TIMEOUT_S + SLACK. Leaves the job's store port in $port.
lose_node() {
    local job=$1 killed=$2 nproc=$3 t0
    local survivor=$((1 - killed))
    local pk=PID_${job}_node$killed ps=PID_${job}_node$survivor
    port=$(free_port)
    local args=(--nnodes 2 --nproc_per_node "$nproc" --master_port "$port" --rdzv_id "lost${killed}_$$")
    start_bg "${job}_node0" "$MTRUN" "${args[@]}" --node_rank 0 "$WORKER" --sleep 60 --marker "$MARKER"
    start_bg "${job}_node1" "$MTRUN" "${args[@]}" --node_rank 1 "$WORKER" --sleep 60 --marker "$MARKER"
    check "job ${job^^}: node 1's ranks started" \
        wait_for_text "$TMP/${job}_node1.out" "[rank$((2 * nproc - 1))]:started" 20
    check "job ${job^^}: node 0's ranks started" \
        wait_for_text "$TMP/${job}_node0.out" "[rank$((nproc - 1))]:started" 20
    t0=$(date +%s.%N)
    kill -9 "${!pk}"
    wait_rc "${!ps}" $((MT_TIMEOUT_S + SLACK))
    check "node $killed killed: node $survivor exits non-zero in time (got $RC after $(seconds_since "$t0") s)" \
        bash -c "[ '$RC' != timeout ] && [ '$RC' != 0 ]"
}

lose_node a 0 2
check "node 0 killed: node 1 says it lost the store" \
    grep -qE "^mtrun: lost the rendezvous store at 127\.0\.0\.1:$port \(node 0 on host $(hostname)\): .*; stopping the job$" "$TMP/a_node1.err"
check "node 0 killed: every rank is gone (node 0's through the parent-death signal)" no_leftovers 10
[ "$FAILURES" = 0 ] || { show a_node0; show a_node1; }

lose_node b 1 1
check "node 1 killed: node 0 names node 1" \
    has_line "$TMP/b_node0.err" "mtrun: node 1 (host $(hostname)) stopped answering (no heartbeat for 5 s); stopping the job"
check "node 1 killed: every rank is gone" no_leftovers 10
[ "$FAILURES" = 0 ] || { show b_node0; show b_node1; }
# A node that finishes early is not lost: the other one runs 2 x MT_TIMEOUT_S longer, and node 0
# keeps the store up for it (both orders). Both exit 0.
for early in 0 1; do
    late=$((1 - early))
    port=$(free_port)
    args=(--nnodes 2 --master_port "$port" --rdzv_id early_$$_$early)
    MT_TIMEOUT_S=2 start_bg "e${early}_node$early" "$MTRUN" "${args[@]}" --node_rank $early \
        "$WORKER" --marker "$MARKER"
    MT_TIMEOUT_S=2 start_bg "e${early}_node$late" "$MTRUN" "${args[@]}" --node_rank $late \
        "$WORKER" --sleep 4 --marker "$MARKER"
    pe=PID_e${early}_node$early
    pl=PID_e${early}_node$late
    wait_rc "${!pl}" 20
    rcl=$RC
    wait_rc "${!pe}" 20
    rce=$RC
    check "node $early finishes first: it exits 0 (got $rce)" test "$rce" = 0
    check "node $early finishes first: node $late still exits 0 (got $rcl)" test "$rcl" = 0
    [ "$FAILURES" = 0 ] || { show "e${early}_node$early"; show "e${early}_node$late"; }
done
finish
