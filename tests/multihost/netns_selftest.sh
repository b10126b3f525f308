#!/usr/bin/env bash
# The multi-host helper itself (netns_lib.sh): three hosts reach each other over eth0 and only
# over it, each has its own hostname, eth0's counters count what crossed, a cut link (eth0 down,
# and an nftables drop) stops traffic with no reset, and whatever the helper made is gone after a
# normal end, after SIGTERM, and (through the next run's sweep) after SIGKILL.
# usage: netns_selftest.sh
set -u
TMP_PREFIX=netns_selftest
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
. "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"
netns_require nft
HERE=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")

netns_setup 3 || { finish; }
for i in 0 1 2; do
    check "host $i is named mthost$i" test "$(host_exec "$i" hostname)" = "mthost$i"
    check "host $i has lo and eth0 only" test \
        "$(ip -n "${NETNS_HOSTS[$i]}" -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort | tr '\n' ' ')" = "eth0 lo "
done
check "host 2 reaches host 1" host_reaches 2 "${NETNS_ADDR[1]}"
# Nothing of the hosts in the machine's own namespace (no address, no link): the tests' traffic
# stays between the hosts.
check "the machine's own namespace has no host address" \
    bash -c "! ip -o addr show | grep -qF ' $NETNS_NET.'"
check "the machine's own namespace has no link of the run" \
    bash -c "! ip -o link show | grep -qF '$NETNS_ID'"

# 1 MB from host 1 to host 0 over TCP: both eth0 counters grow by at least that
read -r rx0 _ < <(link_bytes 0)
read -r _ tx1 < <(link_bytes 1)
host_bg sink 0 python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7777)); s.listen(1); c, _ = s.accept(); n = 0
while True:
    b = c.recv(65536)
    if not b: break
    n += len(b)
print(n)'
sleep 0.5
host_exec 1 python3 -c "
import socket
s = socket.create_connection(('${NETNS_ADDR[0]}', 7777)); s.sendall(b'x' * 1000000); s.close()"
wait_rc "$PID_sink" 10
check "the sink got 1000000 bytes" has_line "$TMP/sink.out" 1000000
read -r rx0b _ < <(link_bytes 0)
read -r _ tx1b _ < <(link_bytes 1)
check "host 0's eth0 received >= 1 MB ($((rx0b - rx0)) B)" test $((rx0b - rx0)) -ge 1000000
check "host 1's eth0 sent >= 1 MB ($((tx1b - tx1)) B)" test $((tx1b - tx1)) -ge 1000000

# A cut link: a connection open across it sees no reset, only silence (the send is not answered)
cut_silently() {
    local how=$1 victim=$2
    host_bg "held_$how" 0 python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7778)); s.listen(1); c, _ = s.accept(); c.settimeout(4)
print("accepted", flush=True)
try:
    b = c.recv(10)
    print("got", b, flush=True)
except socket.timeout:
    print("silence", flush=True)'
    sleep 0.5
    host_bg "peer_$how" "$victim" python3 -c "
import socket, time
s = socket.create_connection(('${NETNS_ADDR[0]}', 7778)); time.sleep(1.5)
try:
    s.send(b'hello')
except OSError as e:
    print('send', e)
time.sleep(5)"
    sleep 0.7
    "cut_$how" "$victim"
    local p="PID_held_$how"
    wait_rc "${!p}" 10
    check "$how: the far side sees silence, no data and no reset" has_line "$TMP/held_$how.out" silence
}
cut_silently link 1
cut_silently nft 2
if host_reaches 2 "${NETNS_ADDR[0]}"; then
    fail "nft: host 2 still reaches host 0"
else
    pass "nft: host 2 no longer reaches host 0"
fi

# host_bg processes run in the host: hosts_empty sees them, and the teardown removes them
host_bg sleeper 1 sleep 600
sleep 0.3
check "a process on host 1 is listed" test -n "$(host_pids 1)"
check "host_bg's pid is the command's own (a signal reaches it)" \
    test "$(cat "/proc/$PID_sleeper/comm" 2>/dev/null)" = sleep
id=$NETNS_ID
netns_teardown
check "teardown: no namespace of the run is left" bash -c "! ip netns list | grep -q '^$id-'"
check "teardown: its record is gone" test ! -e "$NETNS_RUN_DIR/$id"
check "teardown: the process that ran on host 1 is gone" bash -c "! kill -0 $PID_sleeper 2>/dev/null"

# A run ended by SIGTERM removes what it made; one killed by SIGKILL leaves it, and the next
# setup sweeps it away (a live run's namespaces are left alone).
child() {
    bash -c '
. "$1/../lib.sh"; . "$1/netns_lib.sh"
netns_setup 2 >/dev/null
echo "$NETNS_ID" >"$2"
host_exec 1 sleep 600 &
sleep 600 &
wait' child "$HERE" "$1" >/dev/null 2>&1 &
    CHILD=$!
    local t
    for t in $(seq 100); do [ -s "$1" ] && break; sleep 0.1; done
    sleep 0.5
}
child "$TMP/term.id"
term_id=$(cat "$TMP/term.id")
check "a child run made its namespaces" bash -c "ip netns list | grep -q '^$term_id-h1'"
kill -TERM "$CHILD"
wait_rc "$CHILD" 10
check "SIGTERM: the child's namespaces are gone" bash -c "! ip netns list | grep -q '^$term_id-'"

child "$TMP/kill.id"
KILLED=$CHILD
kill_id=$(cat "$TMP/kill.id")
child "$TMP/live.id"
live_id=$(cat "$TMP/live.id")
LIVE=$CHILD
kill -9 "$KILLED"
wait "$KILLED" 2>/dev/null
sleep 0.3
check "SIGKILL: the killed run's namespaces are still there" bash -c "ip netns list | grep -q '^$kill_id-h1'"
netns_setup 1 >"$TMP/sweep.out" || fail "setup after a killed run"
check "the next setup swept the killed run" bash -c "! ip netns list | grep -q '^$kill_id-'"
check "the sweep said so" has_text "$TMP/sweep.out" "removing leftovers of an earlier run that was killed: $kill_id"
check "the sweep left the live run alone" bash -c "ip netns list | grep -q '^$live_id-h1'"
kill -TERM "$LIVE"
wait_rc "$LIVE" 10
check "the live run removed its own at SIGTERM" bash -c "! ip netns list | grep -q '^$live_id-'"
finish
