#!/usr/bin/env bash
# Two mtrun instances on 127.0.0.1 (--nnodes 2, 2 ranks each) form one job and run the collective
# test across both "nodes" with UCX_TLS=tcp,self, so every message between the nodes takes the
# cross-host (tcp) path. Run twice: node 0 started first, then node 1 started first.
# usage: comm_two_nodes.sh MTRUN TEST_PROGRAM
set -u
mtrun=$1
prog=$2
export UCX_TLS=tcp,self
# UCX 1.13 leaves the loopback interface out of tcp unless it is named.
export UCX_NET_DEVICES=lo
export MT_TIMEOUT_S=${MT_TIMEOUT_S:-120}
args=(--max-bytes 4194304 --max-bytes-bf16 1048576)

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

run_pair() {
    local first=$1 second=$2 port
    port=$(free_port)
    local common=(--nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port"
                  --rdzv_id "comm-two-nodes-$port")
    echo "== node $first first (port $port)"
    "$mtrun" "${common[@]}" --node_rank "$first" "$prog" "${args[@]}" &
    local pid_first=$!
    sleep 1
    "$mtrun" "${common[@]}" --node_rank "$second" "$prog" "${args[@]}" &
    local pid_second=$!
    wait "$pid_first"; local rc_first=$?
    wait "$pid_second"; local rc_second=$?
    echo "== node $first exited $rc_first, node $second exited $rc_second"
    [ "$rc_first" -eq 0 ] && [ "$rc_second" -eq 0 ]
}

status=0
run_pair 0 1 || status=1
run_pair 1 0 || status=1
exit $status
