#!/usr/bin/env bash
# mtrun test: a link cut without a TCP reset, for real. The test re-runs itself in a new user and
# network namespace (unshare -rn: no privilege needed where user namespaces are allowed), where an
# nftables rule drops every packet between the store's port and one loopback address: the peers
# behind that address stop acknowledging anything, as a host that lost power or its cable would.
# TCP keepalive and TCP_USER_TIMEOUT on the store's sockets (store/keepalive.c) must notice.
#   A. nodes 1 and 2 reach node 0's store through 127.0.0.2, which is cut: they exit within
#      MT_TIMEOUT_S + 10 s saying that the store's host stopped acknowledging, naming node 0 and
#      its host; node 0 declares them lost; nothing is left.
#   B. only node 2's address (127.0.0.3) is cut: node 0 names node 2, node 1 stops on that
#      failure, node 2 stops on its own; all within MT_TIMEOUT_S + 10 s.
# Exits 77 (skipped) where the namespace or the nftables rule cannot be made.
if [ -z "${MT_LINK_CUT_INNER:-}" ]; then
    if ! unshare -rn true 2>/dev/null; then
        echo "skipped: cannot create a user and network namespace (unshare -rn)"
        exit 77
    fi
    MT_LINK_CUT_INNER=1 exec unshare -rn bash "$0" "$@"
fi
. "$(dirname "$0")/mtrun_lib.sh"
ip link set lo up || { echo "skipped: cannot bring up loopback in the namespace"; exit 77; }
if ! command -v nft >/dev/null ||
    ! nft add table inet cut 2>/dev/null ||
    ! nft add chain inet cut out '{ type filter hook output priority 0; }' 2>/dev/null; then
    echo "skipped: nftables is not usable here (scripts/setup installs nftables)"
    exit 77
fi
export MT_TIMEOUT_S=9 MT_KILL_GRACE_S=2
# Every node reaches the one store through its own loopback address, so node 0's store listens on
# every interface (only this namespace's loopback), not on 127.0.0.1 alone (docs/security.md).
export MT_STORE_LISTEN='*'
LIMIT=$((MT_TIMEOUT_S + 10))
HOST=$(hostname)

since() { awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.1f", t1 - t0 }'; }

# start3 CASE ADDR1 ADDR2: a 3-node job with one sleeping rank per node; node 0 hosts the store
# (and reaches it over 127.0.0.1), node N reaches it through ADDRN
start3() {
    local c=$1 n addr
    port=$(free_port)
    for n in 0 1 2; do
        addr=127.0.0.1
        [ $n = 1 ] && addr=$2
        [ $n = 2 ] && addr=$3
        start_bg "${c}_n$n" "$MTRUN" --nnodes 3 --node_rank $n --master_addr "$addr" \
            --master_port "$port" --rdzv_id "cut_${c}_$$" "$WORKER" --sleep 60 \
            --marker "$MARKER-$c-n$n"
    done
    for n in 0 1 2; do
        check "case $c: node $n's rank started" wait_for_text "$TMP/${c}_n$n.out" "[rank$n]:started" 30
    done
}

# cut_link ADDR: drops every packet to and from the store's port through ADDR, without a reset
cut_link() {
    nft add rule inet cut out ip daddr "$1" tcp dport "$port" drop &&
        nft add rule inet cut out ip saddr "$1" tcp sport "$port" drop
}

# expect_down CASE NODE T0: node NODE's mtrun exits non-zero within LIMIT s of T0
expect_down() {
    local pid=PID_${1}_n$2 took
    wait_rc "${!pid}" "$LIMIT"
    took=$(since "$3")
    echo "case $1: node $2 took $took s to come down (rc $RC)"
    check "case $1: node $2 exits non-zero within $LIMIT s (rc $RC after $took s)" \
        bash -c "[ '$RC' != timeout ] && [ '$RC' != 0 ]"
}

# A: the store's host unreachable from nodes 1 and 2
start3 a 127.0.0.2 127.0.0.2
t0=$(date +%s.%N)
check "case a: link cut" cut_link 127.0.0.2
for n in 1 2 0; do expect_down a $n "$t0"; done
for n in 1 2; do
    check "case a: node $n names node 0, its host and the silence" \
        grep -qE "^mtrun: lost the rendezvous store at 127\.0\.0\.2:$port \(node 0 on host $HOST\): .*stopped acknowledging.*; stopping the job$" "$TMP/a_n$n.err"
done
check "case a: node 0 names a lost node" \
    grep -qE "^mtrun: node [12] \(host $HOST\) stopped answering \(no heartbeat for $MT_TIMEOUT_S s\); stopping the job$" "$TMP/a_n0.err"
check "case a: nothing left" no_leftovers 10
[ "$FAILURES" = 0 ] || { show a_n0; show a_n1; show a_n2; }
nft flush chain inet cut out

# B: only node 2 cut off
start3 b 127.0.0.2 127.0.0.3
t0=$(date +%s.%N)
check "case b: link cut" cut_link 127.0.0.3
for n in 2 0 1; do expect_down b $n "$t0"; done
check "case b: node 0 names node 2" \
    has_line "$TMP/b_n0.err" "mtrun: node 2 (host $HOST) stopped answering (no heartbeat for $MT_TIMEOUT_S s); stopping the job"
check "case b: node 1 gives node 0's reason" has_text "$TMP/b_n1.err" "node 2 (host $HOST) stopped answering"
check "case b: node 2 names the store's host" \
    grep -qE "^mtrun: lost the rendezvous store at 127\.0\.0\.3:$port \(node 0 on host $HOST\)" "$TMP/b_n2.err"
check "case b: nothing left" no_leftovers 10
[ "$FAILURES" = 0 ] || { show b_n0; show b_n1; show b_n2; }
finish
