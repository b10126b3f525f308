#!/usr/bin/env bash
# mtrun test 3: two nodes x two ranks; rank 3 (node 1) exits with code 3 -> both mtrun exit 3,
# node 0's naming the remote rank; every process of the job is gone.
. "$(dirname "$0")/mtrun_lib.sh"

# cross_failure JOB FIRST RANK CODE [WORKER_ARGS...]: a two-node job of two ranks per node, node
# FIRST's mtrun started first, in which rank RANK exits with CODE after 1 s: both mtrun exit
# CODE, both name the rank, and every process of the job is gone.
cross_failure() {
    local job=$1 first=$2 rank=$3 code=$4 port rc0 rc1 line
    shift 4
    local p0=PID_${job}_node0 p1=PID_${job}_node1
    port=$(free_port)
    local args=(--nnodes 2 --nproc_per_node 2 --master_port "$port" --rdzv_id "${job}_$$")
    local prog=("$WORKER" --fail "$rank:$code:1000" --sleep 60 "$@" --marker "$MARKER")
    start_bg "${job}_node$first" "$MTRUN" "${args[@]}" --node_rank "$first" "${prog[@]}"
    start_bg "${job}_node$((1 - first))" "$MTRUN" "${args[@]}" --node_rank $((1 - first)) "${prog[@]}"
    wait_rc "${!p1}" 40
    rc1=$RC
    wait_rc "${!p0}" 40
    rc0=$RC
    line="mtrun: rank $rank (node $((rank / 2)), local rank $((rank % 2))) exited with code $code; stopping the job"
    check "rank $rank fails: node 0 exits $code (got $rc0)" test "$rc0" = "$code"
    check "rank $rank fails: node 1 exits $code (got $rc1)" test "$rc1" = "$code"
    check "rank $rank fails: node 0 names it" has_line "$TMP/${job}_node0.err" "$line"
    check "rank $rank fails: node 1 names it" has_line "$TMP/${job}_node1.err" "$line"
    check "rank $rank fails: every process of the job is gone within 10 s" no_leftovers 10
    [ "$FAILURES" = 0 ] || { show "${job}_node0"; show "${job}_node1"; }
}

cross_failure cross 0 3 3 --child
# The other way round: a rank of node 0 fails, node 1 (started first) follows.
cross_failure cross2 1 0 4
finish
