# Hosts that are really separate, for multi-node tests (sourced, after tests/lib.sh).
#
# netns_setup N makes N "hosts": network namespaces, each with its own loopback and one interface
# eth0 (a veth pair) plugged into a bridge that lives in a namespace of its own (the "switch"),
# addresses $NETNS_NET.1 .. $NETNS_NET.N/24. Commands run in a host (host_exec, host_bg) also get
# a UTS namespace with the hostname mthost<i>, so that every host has its own name. Nothing is
# made in the machine's own network namespace: the hosts reach only each other and their own
# loopback.
#
# Every run's names carry a unique id (mth-<pid>-<random>), so parallel tests do not collide,
# and /run/mth/<id>/owner records the shell that owns them. Whatever ends the script (exit, an
# error, SIGINT, SIGTERM, SIGHUP), netns_teardown kills the processes in its namespaces and
# deletes them; a run killed with SIGKILL (a ctest timeout) leaves them behind, and the next
# netns_setup removes the leftovers of every run whose owner is gone (netns_cleanup_stale).
#
# Where namespaces cannot be made (no CAP_NET_ADMIN, no iproute2, no unshare), netns_require
# says why and exits 77, which the tests register as SKIP_RETURN_CODE.
NETNS_SKIP=77
NETNS_RUN_DIR=/run/mth
NETNS_NET=10.77.0
NETNS_ID=""
NETNS_HOSTS=()   # namespace names, index = host number
NETNS_ADDR=()    # each host's eth0 address
NETNS_SWITCH=""

# netns_skip WHY: the machine cannot make hosts; the test is skipped (not passed)
netns_skip() {
    echo "SKIP: $* (the multi-host tests need root or CAP_NET_ADMIN and CAP_SYS_ADMIN, iproute2" \
        "and util-linux's unshare)"
    exit "$NETNS_SKIP"
}

# netns_require [nft]: exits 77 (skip) unless this shell can make network and UTS namespaces
# (and, with nft, run nftables inside one)
netns_require() {
    local tool probe err
    for tool in ip unshare; do
        command -v "$tool" >/dev/null || netns_skip "'$tool' is not installed"
    done
    probe="mth-probe-$$-$RANDOM"
    if ! err=$(ip netns add "$probe" 2>&1); then
        netns_skip "cannot create a network namespace: $err"
    fi
    # links and addresses need CAP_NET_ADMIN, which making the namespace does not
    if ! err=$({ ip -n "$probe" link add mthp0 type veth peer name mthp1 &&
                 ip -n "$probe" addr add 10.77.255.1/24 dev mthp0; } 2>&1); then
        ip netns del "$probe" 2>/dev/null
        netns_skip "cannot make a link in a network namespace: $err"
    fi
    if ! err=$(ip netns exec "$probe" unshare --uts sh -c 'hostname mthost-probe' 2>&1); then
        ip netns del "$probe" 2>/dev/null
        netns_skip "cannot create a UTS namespace: $err"
    fi
    if [ "${1:-}" = nft ]; then
        if ! command -v nft >/dev/null; then
            ip netns del "$probe" 2>/dev/null
            netns_skip "'nft' is not installed (scripts/setup installs nftables)"
        fi
        if ! err=$(ip netns exec "$probe" nft add table inet mth_probe 2>&1); then
            ip netns del "$probe" 2>/dev/null
            netns_skip "nftables does not work in a network namespace: $err"
        fi
    fi
    ip netns del "$probe" 2>/dev/null
    return 0
}

# pid_start PID: the process's start time in clock ticks (field 22 of /proc/PID/stat), empty when
# it is gone; a pid and its start time name one process even after pids wrap
pid_start() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    # the command name (field 2) may hold spaces: count fields after its closing parenthesis
    stat=${stat##*) }
    set -- $stat
    echo "${20}"
}

# netns_kill_in NAMESPACE: SIGKILLs every process in the namespace (each by its pid) and waits
# up to 5 s until none is left
netns_kill_in() {
    local ns=$1 p t
    for t in $(seq 50); do
        local pids
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] || return 0
        for p in $pids; do kill -9 "$p" 2>/dev/null; done
        sleep 0.1
    done
    echo "netns: processes left in $ns: $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')" >&2
    return 1
}

# netns_remove_run ID: kills what runs in run ID's namespaces and deletes them and its record
netns_remove_run() {
    local id=$1 ns
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$id-"); do
        netns_kill_in "$ns"
        ip netns del "$ns" 2>/dev/null || echo "netns: cannot delete $ns" >&2
    done
    rm -rf "${NETNS_RUN_DIR:?}/$id"
}

# netns_cleanup_stale: removes the namespaces of earlier runs whose owner shell is gone (killed
# with SIGKILL, so that its own teardown never ran). Another live run's are left alone.
netns_cleanup_stale() {
    local ns id owner pid start
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^mth-[0-9]+-[0-9]+-'); do
        id=${ns%-*}
        owner="$NETNS_RUN_DIR/$id/owner"
        if [ -f "$owner" ]; then
            read -r pid start <"$owner"
            [ -n "$pid" ] && [ "$(pid_start "$pid")" = "$start" ] && continue
        else
            # being made right now by its owner (the record is written first), or a record lost:
            # the pid in the name decides
            pid=${id#mth-}
            pid=${pid%%-*}
            [ -d "/proc/$pid" ] && continue
        fi
        echo "netns: removing leftovers of an earlier run that was killed: $id"
        netns_remove_run "$id"
    done
    # records of runs whose namespaces are all gone
    for owner in "$NETNS_RUN_DIR"/mth-*/owner; do
        [ -f "$owner" ] || continue
        read -r pid start <"$owner"
        [ "$(pid_start "$pid")" = "$start" ] || rm -rf "$(dirname "$owner")"
    done
}

# netns_teardown: removes everything this run made (idempotent; runs from the EXIT trap)
netns_teardown() {
    [ -n "$NETNS_ID" ] || return 0
    netns_remove_run "$NETNS_ID"
    NETNS_ID=""
}

# The script's own end runs the teardown first, then lib.sh's cleanup; a signal ends the script
# through exit, so that the EXIT trap runs for it too.
trap 'netns_teardown; cleanup' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

# netns_do CMD...: runs a setup step; a failure fails the test (and says which step)
netns_do() {
    local err
    if ! err=$("$@" 2>&1); then
        fail "netns: '$*' failed: $err"
        return 1
    fi
}

# netns_setup N: makes hosts 0..N-1 (see the top of this file); sets NETNS_HOSTS and NETNS_ADDR
netns_setup() {
    local n=$1 i
    netns_cleanup_stale
    NETNS_ID="mth-$$-$RANDOM$RANDOM"
    mkdir -p "$NETNS_RUN_DIR/$NETNS_ID"
    echo "$$ $(pid_start $$)" >"$NETNS_RUN_DIR/$NETNS_ID/owner"
    NETNS_SWITCH="$NETNS_ID-sw"
    netns_do ip netns add "$NETNS_SWITCH" || return 1
    netns_do ip -n "$NETNS_SWITCH" link add br0 type bridge || return 1
    netns_do ip -n "$NETNS_SWITCH" link set br0 up || return 1
    NETNS_HOSTS=()
    NETNS_ADDR=()
    for ((i = 0; i < n; i++)); do
        local ns="$NETNS_ID-h$i" addr="$NETNS_NET.$((i + 1))"
        netns_do ip netns add "$ns" || return 1
        # Made inside the switch namespace, the pair never appears in the machine's own: its
        # host end moves straight into the host's namespace as eth0.
        netns_do ip -n "$NETNS_SWITCH" link add "p$i" type veth peer name eth0 netns "$ns" || return 1
        netns_do ip -n "$NETNS_SWITCH" link set "p$i" master br0 up || return 1
        netns_do ip -n "$ns" link set lo up || return 1
        netns_do ip -n "$ns" addr add "$addr/24" dev eth0 || return 1
        netns_do ip -n "$ns" link set eth0 up || return 1
        NETNS_HOSTS+=("$ns")
        NETNS_ADDR+=("$addr")
    done
    # The bridge forwards once its ports leave the learning states; wait until every host reaches
    # every other (a few pings), so that a test's first connection does not race the links.
    for ((i = 1; i < n; i++)); do
        local t ok=0
        for t in $(seq 50); do
            if host_reaches 0 "${NETNS_ADDR[$i]}" && host_reaches "$i" "${NETNS_ADDR[0]}"; then
                ok=1
                break
            fi
            sleep 0.1
        done
        [ "$ok" = 1 ] || { fail "netns: host $i and host 0 do not reach each other"; return 1; }
    done
    echo "netns: $n host(s) ${NETNS_ADDR[*]} in namespaces $NETNS_ID-h0..h$((n - 1))"
}

# host_exec I CMD...: runs CMD on host I (its network namespace, a UTS namespace named mthost<I>;
# the same pid namespace and files as this shell). ip netns exec, unshare and sh each exec the
# next: started in the background, the pid is CMD's own.
host_cmd() {
    HOST_CMD=(ip netns exec "${NETNS_HOSTS[$1]}" unshare --uts sh -c 'hostname "$0" && exec "$@"'
              "mthost$1")
}
host_exec() {
    host_cmd "$1"
    shift
    "${HOST_CMD[@]}" "$@"
}

# host_bg NAME I CMD...: start_bg NAME of CMD on host I; PID_<NAME> is CMD's pid (so a signal
# sent to it reaches CMD itself)
host_bg() {
    local name=$1
    host_cmd "$2"
    shift 2
    start_bg "$name" "${HOST_CMD[@]}" "$@"
}

# host_reaches I ADDR: host I reaches ADDR now: a TCP connection to a closed port (9) is refused
# (an answer) within 1 s, rather than timing out or finding no route. (No ping: iputils is not a
# dependency.)
host_reaches() {
    host_exec "$1" python3 -c '
import socket, sys
s = socket.socket(); s.settimeout(1)
try:
    s.connect((sys.argv[1], 9))
except ConnectionRefusedError:
    sys.exit(0)
except OSError:
    sys.exit(1)
sys.exit(0)' "$2" 2>/dev/null
}

# host_pids I: the pids of every process on host I, one a line
host_pids() { ip netns pids "${NETNS_HOSTS[$1]}" 2>/dev/null; }

# hosts_empty SECONDS: true once no process is left on any host, waiting at most SECONDS; lists
# the survivors otherwise
hosts_empty() {
    local t i left
    for ((t = 0; t <= $1 * 10; t++)); do
        left=""
        for i in "${!NETNS_HOSTS[@]}"; do left+=$(host_pids "$i"); done
        [ -z "$left" ] && return 0
        sleep 0.1
    done
    for i in "${!NETNS_HOSTS[@]}"; do
        for left in $(host_pids "$i"); do
            echo "still alive on host $i: $(tr '\0' ' ' <"/proc/$left/cmdline" 2>/dev/null)" >&2
        done
    done
    return 1
}

# link_bytes I: bytes received and sent on host I's eth0, "RX TX"
link_bytes() {
    local d=/sys/class/net/eth0/statistics
    ip netns exec "${NETNS_HOSTS[$1]}" sh -c "echo \$(cat $d/rx_bytes) \$(cat $d/tx_bytes)"
}

# cut_link I: takes host I off the network without a reset: its eth0 goes down, so nothing
# leaves or reaches it and no peer is told
cut_link() { ip -n "${NETNS_HOSTS[$1]}" link set eth0 down; }

# cut_nft I: the same through nftables: every packet in or out of host I's eth0 is dropped
# silently (loopback still works, as on a host whose cable was pulled)
cut_nft() {
    ip netns exec "${NETNS_HOSTS[$1]}" nft -f - <<'EOF'
table inet mth_cut {
    chain in { type filter hook input priority -300; policy accept; iifname "eth0" drop; }
    chain out { type filter hook output priority -300; policy accept; oifname "eth0" drop; }
}
EOF
}
