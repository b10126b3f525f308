#!/usr/bin/env bash
# mtrun as torchrun's c10d rendezvous: every node runs the identical command line (no node rank)
# against --rdzv-endpoint 127.0.0.1:PORT; nodes take node ranks in the order they join, the ranks
# see torchrun's variables, a third node is refused, and a missing node or an endpoint that is
# not this machine's ends the wait with a clear message, as does a job mixing the two backends;
# --local-addr and is_host decide whether a node hosts the store.
. "$(dirname "$0")/mtrun_lib.sh"
export MT_TIMEOUT_S=20

# same_line ORDER FIRST SECOND: starts two mtrun with one command line, FIRST 1 s before SECOND;
# FIRST must get node rank 0 and SECOND node rank 1.
same_line() {
    local order=$1 first=$2 second=$3 port job rc
    port=$(free_port)
    job="c10d_${order}_$$"
    local cmd=("$MTRUN" --nnodes 2:2 --nproc-per-node 2 --rdzv-backend c10d
               --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "$job" --role trainer
               --max-restarts 0 --monitor-interval 0.5 "$WORKER" --env --sleep 2 --marker "$MARKER")
    start_bg "$first" "${cmd[@]}"
    sleep 1
    start_bg "$second" "${cmd[@]}"
    if [ "$order" = a_first ]; then
        # A third node with the same command line while the job runs: the job is full.
        check "$order: the first nodes run" wait_for_text "$TMP/$second.out" "started" 20
        start_bg "${order}_third" "${cmd[@]}"
        local third=PID_${order}_third
        wait_rc "${!third}" 20
        rc=$RC
        check "$order: a third node exits 1 (got $rc)" test "$rc" = 1
        check "$order: the third node is told the job is full" has_text "$TMP/${order}_third.err" \
            "mtrun: job '$job' already has its 2 nodes (this mtrun arrived as node number 3)"
    fi
    local p1=PID_$first p2=PID_$second
    wait_rc "${!p1}" 30
    check "$order: $first exits 0 (got $RC)" test "$RC" = 0
    wait_rc "${!p2}" 30
    check "$order: $second exits 0 (got $RC)" test "$RC" = 0
    local node=0 name
    for name in "$first" "$second"; do
        for lr in 0 1; do
            local r=$((node * 2 + lr))
            local expect=("RANK=$r" "LOCAL_RANK=$lr" "WORLD_SIZE=4" "LOCAL_WORLD_SIZE=2"
                          "GROUP_RANK=$node" "GROUP_WORLD_SIZE=2" "ROLE_RANK=$r"
                          "ROLE_WORLD_SIZE=4" "ROLE_NAME=trainer" "TORCHELASTIC_RESTART_COUNT=0"
                          "TORCHELASTIC_MAX_RESTARTS=0" "TORCHELASTIC_RUN_ID=$job"
                          "MASTER_ADDR=127.0.0.1" "MASTER_PORT=$port" "MT_NNODES=2")
            for kv in "${expect[@]}"; do
                check "$order: $name (node $node) rank $r has $kv" has_line "$TMP/$name.out" "[rank$r]:env $kv"
            done
        done
        node=$((node + 1))
    done
    [ "$FAILURES" = 0 ] || { show "$first"; show "$second"; }
}

same_line a_first nodeA nodeB
same_line b_first nodeB2 nodeA2

# One node of two: --rdzv-conf join_timeout bounds the wait, and the message names the setting.
port=$(free_port)
start_bg alone "$MTRUN" --nnodes 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" \
    --rdzv-id alone_$$ --rdzv-conf join_timeout=2,last_call_timeout=1 "$WORKER" --marker "$MARKER"
wait_rc "$PID_alone" 15
check "alone: exits 1 (got $RC)" test "$RC" = 1
check "alone: names the missing node and join_timeout" has_text "$TMP/alone.err" \
    "mtrun: node 1 never joined job 'alone_$$' within 2 s (--rdzv_conf join_timeout)"
check "alone: no rank was started" bash -c "! grep -q started '$TMP/alone.out'"

# An endpoint that is not this machine's: this node does not host the store, so it waits to
# reach it (192.0.2.1 is TEST-NET-1, never assigned).
start_bg remote "$MTRUN" --nnodes 2 --rdzv-backend c10d --rdzv-endpoint 192.0.2.1:29400 \
    --rdzv-id remote_$$ --rdzv-conf join_timeout=2 "$WORKER" --marker "$MARKER"
wait_rc "$PID_remote" 15
check "remote endpoint: exits 1 (got $RC)" test "$RC" = 1
check "remote endpoint: says it could not reach the store" has_text "$TMP/remote.err" \
    "mtrun: this node could not reach the rendezvous store at 192.0.2.1:29400 within 2 s (--rdzv_conf join_timeout;"
[ "$FAILURES" = 0 ] || { show alone; show remote; }

# The hosting rule, seen from a node alone: a node that hosts the store waits for the missing
# node ("never joined"); one that does not host it waits for the store ("could not reach").
# hosting NAME EXPECTED-TEXT OPTIONS...
hosting() {
    local name=$1 expect=$2 port
    shift 2
    port=$(free_port)
    start_bg "$name" "$MTRUN" --nnodes 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" \
        --rdzv-id "${name}_$$" "$@" "$WORKER" --marker "$MARKER"
    local pid=PID_$name
    wait_rc "${!pid}" 15
    check "$name: exits 1 (got $RC)" test "$RC" = 1
    check "$name: says '$expect'" has_text "$TMP/$name.err" "$expect"
    [ "$FAILURES" = 0 ] || show "$name"
}
hosting local_addr_other "mtrun: this node could not reach the rendezvous store" \
    --local-addr 127.0.0.2 --rdzv-conf join_timeout=2
hosting local_addr_same "mtrun: node 1 never joined job 'local_addr_same_$$'" \
    --local-addr 127.0.0.1 --rdzv-conf join_timeout=2
hosting is_host_false "mtrun: this node could not reach the rendezvous store" \
    --rdzv-conf join_timeout=2,is_host=false

# A c10d node that cannot host the store for another reason than a taken port (here: a hard limit
# of 6 file descriptors, below what the store needs) says why and stops, rather than joining as a
# client of a store nobody hosts.
port=$(free_port)
start_bg nofd bash -c 'ulimit -n 6; exec "$@"' nofd "$MTRUN" --nnodes 2 --rdzv-backend c10d \
    --rdzv-endpoint "127.0.0.1:$port" --rdzv-id nofd_$$ --rdzv-conf join_timeout=2 \
    "$WORKER" --marker "$MARKER"
wait_rc "$PID_nofd" 15
check "cannot host: exits 1 (got $RC)" test "$RC" = 1
check "cannot host: says why" grep -qE \
    "^mtrun: the rendezvous store this mtrun hosts needs about [0-9]+ open files, but the hard open-file limit \(RLIMIT_NOFILE\) of this process is 6: raise it" \
    "$TMP/nofd.err"
check "cannot host: does not wait for a store" bash -c "! grep -q 'rendezvous store at' '$TMP/nofd.err'"
[ "$FAILURES" = 0 ] || show nofd

# A static node and a c10d node in one job: both stop, naming the two backends.
port=$(free_port)
start_bg mixs "$MTRUN" --nnodes 2 --node-rank 0 --master-port "$port" --rdzv-id mix_$$ \
    "$WORKER" --marker "$MARKER"
sleep 0.5
start_bg mixc "$MTRUN" --nnodes 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" \
    --rdzv-id mix_$$ "$WORKER" --marker "$MARKER"
wait_rc "$PID_mixc" 15
check "mixed backends: the c10d node exits 1 (got $RC)" test "$RC" = 1
wait_rc "$PID_mixs" 15
check "mixed backends: the static node exits 1 (got $RC)" test "$RC" = 1
# Both took node rank 0: the message tells them apart by their mtrun's pid and host.
msg="node 0 (mtrun pid $PID_mixc on host $(hostname)) was started with --rdzv_backend c10d but node 0 (mtrun pid $PID_mixs on host $(hostname)) with --rdzv_backend static; every node of job 'mix_$$' needs the same backend"
check "mixed backends: the c10d node explains" has_text "$TMP/mixc.err" "mtrun: $msg"
check "mixed backends: the static node explains" has_text "$TMP/mixs.err" "mtrun: $msg"
check "mixed backends: no rank was started" bash -c "! grep -q started '$TMP/mixs.out' '$TMP/mixc.out'"
[ "$FAILURES" = 0 ] || { show mixs; show mixc; }
check "no leftovers" no_leftovers 10
finish
