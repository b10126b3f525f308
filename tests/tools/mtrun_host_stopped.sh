#!/usr/bin/env bash
# mtrun test: a host that stops answering without a TCP reset. A SIGSTOPped mtrun keeps its
# sockets open and answers nothing (its kernel still acknowledges, so this is the harder case
# for the other nodes: only their own answer limits can tell). Three nodes on 127.0.0.1:
#   A. node 0 (the store's host) stopped: nodes 1 and 2 exit non-zero within MT_TIMEOUT_S + 10 s,
#      naming node 0 and its host, and nothing is left once node 0 is killed;
#   B. node 1 stopped: nodes 0 and 2 exit within MT_TIMEOUT_S + 10 s, node 0 naming node 1;
#   C. node 0 stopped, then node 1 gets SIGTERM: node 1's rank is gone within 1 s (the ranks are
#      signalled before the failure is published to the store that no longer answers; SIGTERM
#      rather than a Ctrl-C's SIGINT, which bash makes background commands ignore);
#   D. node 0's mtrun gets SIGHUP: it exits 129, its rank gets SIGTERM, the others exit naming it;
#   E. c10d (the identical line twice): the hosting mtrun stopped, the other one names the
#      hosting node by its node rank and host.
# Each case prints how long the job took to come down ("took N s").
. "$(dirname "$0")/mtrun_lib.sh"
export MT_TIMEOUT_S=6 MT_KILL_GRACE_S=2
LIMIT=$((MT_TIMEOUT_S + 10))
HOST=$(hostname)

since() { awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.1f", t1 - t0 }'; }

# start3 CASE: a 3-node job, one sleeping rank per node; node N's rank carries $MARKER-CASE-nN
start3() {
    local c=$1 n
    port=$(free_port)
    for n in 0 1 2; do
        start_bg "${c}_n$n" "$MTRUN" --nnodes 3 --node_rank $n --master_port "$port" \
            --rdzv_id "stopped_${c}_$$" "$WORKER" --sleep 60 --marker "$MARKER-$c-n$n"
    done
    for n in 0 1 2; do
        check "case $c: node $n's rank started" wait_for_text "$TMP/${c}_n$n.out" "[rank$n]:started" 30
    done
}

# gone MARK SECONDS: no rank (a worker process, not the mtrun that started it, whose command
# line carries the mark too) with MARK is left within SECONDS
gone() {
    local t=0
    while pgrep -f -- "^$WORKER .*$1\$" >/dev/null; do
        [ "$t" -ge $(($2 * 10)) ] && return 1
        sleep 0.1
        t=$((t + 1))
    done
}

# expect_down CASE NODE T0: node NODE's mtrun exits non-zero within LIMIT s of T0
expect_down() {
    local pid=PID_${1}_n$2
    wait_rc "${!pid}" "$LIMIT"
    local took
    took=$(since "$3")
    echo "case $1: node $2 took $took s to come down (rc $RC)"
    check "case $1: node $2 exits non-zero within $LIMIT s (rc $RC after $took s)" \
        bash -c "[ '$RC' != timeout ] && [ '$RC' != 0 ]"
}

# end_case CASE NODE: kills the stopped node NODE (its rank follows through the parent-death
# signal), then nothing of the case may be left; shows the case's output on a failure
end_case() {
    local pid=PID_${1}_n$2
    kill -KILL "${!pid}"
    check "case $1: nothing left once node $2 is killed" no_leftovers 10
    [ "$FAILURES" = 0 ] || { show "$1_n0"; show "$1_n1"; show "$1_n2"; }
}

# A: the store's host stops answering
start3 a
t0=$(date +%s.%N)
kill -STOP "$PID_a_n0"
expect_down a 1 "$t0"
expect_down a 2 "$t0"
for n in 1 2; do
    check "case a: node $n names node 0 and its host" \
        grep -qE "^mtrun: lost the rendezvous store at 127\.0\.0\.1:$port \(node 0 on host $HOST\): .*; stopping the job$" "$TMP/a_n$n.err"
    check "case a: node $n's rank is gone" gone "$MARKER-a-n$n" 5
done
end_case a 0

# B: a node that is not the store's host stops answering
start3 b
t0=$(date +%s.%N)
kill -STOP "$PID_b_n1"
expect_down b 0 "$t0"
expect_down b 2 "$t0"
check "case b: node 0 names node 1 and its host" \
    has_line "$TMP/b_n0.err" "mtrun: node 1 (host $HOST) stopped answering (no heartbeat for $MT_TIMEOUT_S s); stopping the job"
check "case b: node 2 gives the same reason" has_text "$TMP/b_n2.err" "node 1 (host $HOST) stopped answering"
end_case b 1

# C: a node told to stop while the store does not answer
start3 c
kill -STOP "$PID_c_n0"
sleep 0.5
t0=$(date +%s.%N)
kill -TERM "$PID_c_n1"
check "case c: node 1's rank is gone within 1 s of SIGTERM" gone "$MARKER-c-n1" 1
echo "case c: node 1's rank gone after $(since "$t0") s"
expect_down c 1 "$t0"
expect_down c 2 "$t0"
end_case c 0

# D: node 0's mtrun loses its terminal (SIGHUP)
start3 d
t0=$(date +%s.%N)
kill -HUP "$PID_d_n0"
wait_rc "$PID_d_n0" "$LIMIT"
echo "case d: node 0 took $(since "$t0") s to come down (rc $RC)"
check "case d: node 0 exits 129 after SIGHUP (got $RC)" test "$RC" = 129
check "case d: node 0 says so" has_line "$TMP/d_n0.err" "mtrun: node 0 received SIGHUP; stopping the job"
check "case d: node 0's rank is gone" gone "$MARKER-d-n0" 5
expect_down d 1 "$t0"
expect_down d 2 "$t0"
for n in 1 2; do
    check "case d: node $n names node 0's SIGHUP" has_text "$TMP/d_n$n.err" "node 0 received SIGHUP"
done
check "case d: nothing left" no_leftovers 10
[ "$FAILURES" = 0 ] || { show d_n0; show d_n1; show d_n2; }

# E: c10d, the store's host stops answering
port=$(free_port)
for i in 1 2; do
    start_bg "e_$i" "$MTRUN" --nnodes 2 --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$port" \
        --rdzv_id "stopped_e_$$" "$WORKER" --sleep 60 --marker "$MARKER-e-$i"
    sleep 1 # the first one opens the port: it hosts the store
done
for i in 1 2; do
    check "case e: mtrun $i's rank started" wait_for_text "$TMP/e_$i.out" "started" 30
done
t0=$(date +%s.%N)
kill -STOP "$PID_e_1"
wait_rc "$PID_e_2" "$LIMIT"
echo "case e: the other node took $(since "$t0") s to come down (rc $RC)"
check "case e: the other node exits non-zero within $LIMIT s (rc $RC)" \
    bash -c "[ '$RC' != timeout ] && [ '$RC' != 0 ]"
check "case e: it names the hosting node and its host" \
    grep -qE "^mtrun: lost the rendezvous store at 127\.0\.0\.1:$port \(node [01] on host $HOST\): " "$TMP/e_2.err"
kill -KILL "$PID_e_1"
check "case e: nothing left once the hosting node is killed" no_leftovers 10
[ "$FAILURES" = 0 ] || { show e_1; show e_2; }
finish
