#!/usr/bin/env bash
# mtrun test 1: the ranks' environment, [rankN]: prefixes, stdout/stderr separation, --log_dir
# files, long lines; two nodes x two ranks on 127.0.0.1, started in both orders.
. "$(dirname "$0")/mtrun_lib.sh"

# check_node ORDER NODE PORT JOB: the output of one mtrun of a 2 x 2 job
check_node() {
    local order=$1 node=$2 port=$3 job=$4 name="${1}_node$2"
    local out="$TMP/$name.out" err="$TMP/$name.err"
    # both nodes share --log_dir and the job id: each names its own directory below it
    local logs
    logs=$(sed -n 's|^mtrun: log files of the ranks: \(.*\)/attempt_0/LOCAL_RANK/.*|\1/attempt_0|p' "$err")
    check "$order node $node: log directory named, under --log_dir" bash -c "[[ '$logs' == '$TMP/logs_$order/${job}_'??????/attempt_0 ]]"
    for lr in 0 1; do
        local r=$((node * 2 + lr))
        local expect=("RANK=$r" "LOCAL_RANK=$lr" "WORLD_SIZE=4" "LOCAL_WORLD_SIZE=2"
                      "GROUP_RANK=$node" "MASTER_ADDR=127.0.0.1" "MASTER_PORT=$port"
                      "MT_RDZV_ID=$job" "TORCHELASTIC_RUN_ID=$job" "MT_NNODES=2"
                      "MT_STORE_HOSTED=1" "OMP_NUM_THREADS=1" "OPENBLAS_NUM_THREADS=1")
        for kv in "${expect[@]}"; do
            check "$order: rank $r has $kv" has_line "$out" "[rank$r]:env $kv"
        done
        check "$order: rank $r stderr line on mtrun's stderr" has_line "$err" "[rank$r]:to-stderr rank=$r"
        check "$order: rank $r stderr line not on stdout" bash -c "! grep -qF 'to-stderr rank=$r' '$out'"
        check "$order: rank $r last line without newline printed" has_line "$out" "[rank$r]:tail rank=$r"
        check "$order: rank $r log file stdout unprefixed" has_line "$logs/$lr/stdout.log" "env RANK=$r"
        check "$order: rank $r log file stderr" has_line "$logs/$lr/stderr.log" "to-stderr rank=$r"
        check "$order: rank $r log file has no prefix" bash -c "! grep -qF '[rank' '$logs/$lr/stdout.log'"
        check "$order: rank $r log file keeps the missing newline" bash -c "tail -c 12 '$logs/$lr/stdout.log' | grep -qx 'tail rank=$r'"
        # the long line arrives whole: prefix + "long:" + 200000 characters
        check "$order: rank $r long line intact" bash -c \
            "grep '^\[rank$r\]:long:' '$out' | awk '{ if (length(\$0) != length(\"[rank$r]:long:\") + 200000) exit 1; n++ } END { exit n != 1 }'"
    done
    # every line on stdout/stderr is a whole prefixed line of this node's ranks: nothing mixed
    check "$order node $node: every stdout line prefixed" bash -c "! grep -vqE '^\[rank$((node * 2))\]:|^\[rank$((node * 2 + 1))\]:' '$out'"
    check "$order node $node: no prefix inside a line" bash -c "! grep -qE '.\[rank[0-9]+\]:' '$out'"
}

for order in node0_first node1_first; do
    port=$(free_port)
    job="envjob_$order"
    args=(--nnodes 2 --nproc-per-node 2 --master_addr 127.0.0.1 --master_port "$port"
          --rdzv_id "$job" --log_dir "$TMP/logs_$order")
    prog=("$WORKER" --env --long 200000 --marker "$MARKER")
    if [ "$order" = node0_first ]; then
        start_bg "${order}_node0" "$MTRUN" "${args[@]}" --node_rank 0 "${prog[@]}"
        sleep 0.5
        start_bg "${order}_node1" "$MTRUN" "${args[@]}" --node-rank=1 "${prog[@]}"
    else
        start_bg "${order}_node1" "$MTRUN" "${args[@]}" --node-rank=1 "${prog[@]}"
        sleep 1.5 # node 1 retries connecting until node 0's store is up
        start_bg "${order}_node0" "$MTRUN" "${args[@]}" --node_rank 0 "${prog[@]}"
    fi
    p0=PID_${order}_node0
    p1=PID_${order}_node1
    wait_rc "${!p0}" 40
    rc0=$RC
    wait_rc "${!p1}" 40
    rc1=$RC
    check "$order: node 0 exits 0 (got $rc0)" test "$rc0" = 0
    check "$order: node 1 exits 0 (got $rc1)" test "$rc1" = 0
    [ "$rc0" = 0 ] && [ "$rc1" = 0 ] || { show "${order}_node0"; show "${order}_node1"; }
    check_node "$order" 0 "$port" "$job"
    check_node "$order" 1 "$port" "$job"
done

# One rank: OMP left alone, OpenBLAS at 1 thread (docs/mtrun.md); a user's own setting is kept.
start_bg single "$MTRUN" --standalone "$WORKER" --env --marker "$MARKER"
wait_rc "$PID_single" 20
check "single rank: exit 0 (got $RC)" test "$RC" = 0
check "single rank: OMP_NUM_THREADS not set" has_line "$TMP/single.out" "[rank0]:env OMP_NUM_THREADS=<unset>"
check "single rank: OPENBLAS_NUM_THREADS=1" has_line "$TMP/single.out" "[rank0]:env OPENBLAS_NUM_THREADS=1"
OPENBLAS_NUM_THREADS=3 start_bg blas "$MTRUN" --standalone "$WORKER" --env --marker "$MARKER"
wait_rc "$PID_blas" 20
check "user OPENBLAS_NUM_THREADS: exit 0 (got $RC)" test "$RC" = 0
check "user OPENBLAS_NUM_THREADS kept" has_line "$TMP/blas.out" "[rank0]:env OPENBLAS_NUM_THREADS=3"
check "single rank: defaults (job id none, one node)" has_line "$TMP/single.out" "[rank0]:env MT_RDZV_ID=none"
check "single rank: --standalone picks a port" bash -c "! grep -qxF '[rank0]:env MASTER_PORT=29500' '$TMP/single.out' && grep -qE '^\[rank0\]:env MASTER_PORT=[1-9][0-9]*$' '$TMP/single.out'"
OMP_NUM_THREADS=7 start_bg omp "$MTRUN" --standalone --nproc_per_node=2 "$WORKER" --env --marker "$MARKER"
wait_rc "$PID_omp" 20
check "user OMP_NUM_THREADS: exit 0 (got $RC)" test "$RC" = 0
check "user OMP_NUM_THREADS kept" has_line "$TMP/omp.out" "[rank1]:env OMP_NUM_THREADS=7"
check "OPENBLAS_NUM_THREADS still defaulted" has_line "$TMP/omp.out" "[rank1]:env OPENBLAS_NUM_THREADS=1"
check "no leftovers" no_leftovers 5
finish
