#!/usr/bin/env bash
# mtrun and the store's security (docs/security.md): a --standalone job listens on loopback only
# (store and the ranks' UCX, seen with ss) and hands its ranks a fresh token in an environment
# only their user can read; a token file others may read is refused; two nodes with the same
# token (variable or file) train, with different tokens fail fast and say why, without one warn;
# a store limit out of range is refused; on a real interface, named by MT_SOCKET_IFNAME or reached
# by --master_addr, two nodes start (node 0 reaches its own store where it listens) and the store
# and the ranks' UCX listen on that interface's address only.
#   mtrun_security.sh MTRUN WORKER FREEPORT PROG_INIT
. "$(dirname "$0")/mtrun_lib.sh"
PROG=$4
TOKEN_A=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
TOKEN_B=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb

# listeners PID...: the local addresses of the TCP sockets these processes listen on
listeners() {
    local pid
    for pid in "$@"; do
        ss -ltnpH | grep -F "pid=$pid," | awk '{print $4}'
    done
}

# only_loopback FILE: every address in FILE (one per line) is 127.0.0.1 or [::1], and there is one
only_loopback() {
    [ -s "$1" ] && ! grep -vE '^(127\.0\.0\.1|\[::1\]):[0-9]+$' "$1" >/dev/null
}

# only_addr ADDR FILE: every address in FILE is ADDR:port, and there is one
only_addr() {
    [ -s "$2" ] && ! grep -vE "^$1:[0-9]+\$" "$2" >/dev/null
}

# has_token PID: the process's environment holds an MT_STORE_TOKEN of 64 hex digits
has_token() {
    tr '\0' '\n' <"/proc/$1/environ" | grep -qE '^MT_STORE_TOKEN=[0-9a-f]{64}$'
}

# nofile_raised PID: the process's soft open-file limit is its hard one (and above 256)
nofile_raised() {
    awk '/^Max open files/ { exit !($4 == $5 && ($4 == "unlimited" || $4 > 256)) }' "/proc/$1/limits"
}

# wait_ranks NAME N: waits until N ranks of start_bg's NAME finished their all_reduce
wait_ranks() {
    local t=0
    while [ "$(grep -c 'allreduce ok' "$TMP/$1.out" 2>/dev/null)" -lt "$2" ]; do
        [ "$t" -ge 300 ] && return 1
        sleep 0.1
        t=$((t + 1))
    done
}

# --- a standalone job: loopback only, a fresh token in a private environment -------------------
if ! command -v ss >/dev/null; then
    echo "skip: no ss (iproute2) to list listening sockets"
else
    # A soft open-file limit below the hard one: mtrun and the ranks raise it.
    start_bg sa bash -c 'ulimit -Sn 256; exec "$@"' sa "$MTRUN" --standalone --nproc_per_node 2 \
        "$PROG" --hold 8 --marker "$MARKER"
    check "standalone: both ranks ran their all_reduce" wait_ranks sa 2
    mapfile -t ranks < <(pgrep -P "$PID_sa")
    listeners "$PID_sa" "${ranks[@]}" >"$TMP/sa.listen"
    check "standalone: mtrun and its ranks listen on loopback only ($(tr '\n' ' ' <"$TMP/sa.listen"))" \
        only_loopback "$TMP/sa.listen"
    check "standalone: the store and both ranks' UCX listen (3 sockets or more)" \
        test "$(wc -l <"$TMP/sa.listen")" -ge 3
    for r in "$PID_sa" "${ranks[@]}"; do
        check "standalone: process $r raised its open-file limit to the hard one" nofile_raised "$r"
    done
    for r in "${ranks[@]}"; do
        check "standalone: rank $r's environment is its user's alone (mode 400)" \
            test "$(stat -c %a "/proc/$r/environ")" = 400
        check "standalone: rank $r has a 64-hex-digit MT_STORE_TOKEN" has_token "$r"
    done
    expect_rc sa 0 40
fi

# --- a store limit out of range stops mtrun before any rank starts ------------------------------
MT_STORE_MAX_CLIENTS=0 start_bg cap "$MTRUN" --standalone "$WORKER" --marker "$MARKER"
expect_rc cap nonzero 20
check "MT_STORE_MAX_CLIENTS=0 is refused, naming the variable and its range" \
    has_text "$TMP/cap.err" "MT_STORE_MAX_CLIENTS=0 is not an integer in 1..1000000"

# --- token files ---------------------------------------------------------------------------------
printf '%s\n' "$TOKEN_A" >"$TMP/token"
chmod 644 "$TMP/token"
port=$(free_port)
start_bg open "$MTRUN" --nnodes 2 --node_rank 0 --master_port "$port" \
    --rdzv_conf "token_file=$TMP/token" "$WORKER" --marker "$MARKER"
expect_rc open nonzero 20
check "a token file of mode 0644 is refused, naming it and the mode" \
    has_text "$TMP/open.err" "the store token file $TMP/token has mode 0644"
check "the refusal says how to fix it" has_text "$TMP/open.err" "chmod 600 $TMP/token"
chmod 600 "$TMP/token"

# --- two nodes on loopback with one token: node 0 from a file, node 1 from the variable ---------
port=$(free_port)
NODES=(--nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port" --rdzv_id sec)
start_bg t0 "$MTRUN" "${NODES[@]}" --node_rank 0 --rdzv_conf "token_file=$TMP/token" \
    "$PROG" --hold 0 --marker "$MARKER"
MT_STORE_TOKEN=$TOKEN_A start_bg t1 "$MTRUN" "${NODES[@]}" --node_rank 1 "$PROG" --hold 0 \
    --marker "$MARKER"
expect_rc t0 0 60
expect_rc t1 0 60
check "same token: the four ranks ran their all_reduce" \
    test "$(cat "$TMP/t0.out" "$TMP/t1.out" | grep -c 'allreduce ok')" = 4
check "same token: no warning about an open store" \
    sh -c "! grep -qF 'no store token' '$TMP/t0.err' '$TMP/t1.err'"

# --- different tokens: the second node fails at once, naming the cause -------------------------
port=$(free_port)
NODES=(--nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port "$port" --rdzv_id sec)
start=$(date +%s)
MT_TIMEOUT_S=60 MT_STORE_TOKEN=$TOKEN_A start_bg m0 "$MTRUN" "${NODES[@]}" --node_rank 0 \
    --rdzv_conf join_timeout=6 "$WORKER" --marker "$MARKER"
MT_TIMEOUT_S=60 MT_STORE_TOKEN=$TOKEN_B start_bg m1 "$MTRUN" "${NODES[@]}" --node_rank 1 \
    "$WORKER" --marker "$MARKER"
wait_rc "$PID_m1" 30
rc1=$RC
took1=$(($(date +%s) - start))
check "different tokens: node 1 fails (exit $rc1) within 10 s, not MT_TIMEOUT_S (took $took1 s)" \
    test "$rc1" = 1 -a "$took1" -le 10
check "different tokens: node 1 says the store refused its token" \
    has_text "$TMP/m1.err" "refused the handshake: this process has a store token the store does not accept"
wait_rc "$PID_m0" 30
check "different tokens: node 0 gives up after its join timeout (exit $RC)" test "$RC" = 1
check "different tokens: node 0's store logged the refused client" \
    has_text "$TMP/m0.err" "closing unauthenticated connection from 127.0.0.1"
[ "$FAILURES" = 0 ] || { show m0; show m1; }

# --- no token on two nodes: a warning, then the job runs -----------------------------------------
port=$(free_port)
NODES=(--nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port "$port" --rdzv_id sec)
start_bg w0 env -u MT_STORE_TOKEN "$MTRUN" "${NODES[@]}" --node_rank 0 "$WORKER" --marker "$MARKER"
start_bg w1 env -u MT_STORE_TOKEN "$MTRUN" "${NODES[@]}" --node_rank 1 "$WORKER" --marker "$MARKER"
expect_rc w0 0 30
expect_rc w1 0 30
check "no token: node 0 warns that the store is open" \
    has_text "$TMP/w0.err" "mtrun: warning: no store token (MT_STORE_TOKEN or --rdzv_conf token_file=PATH): the rendezvous store on port $port is open to anyone who can reach it"
check "no token: it warns once" test "$(grep -c 'no store token' "$TMP/w0.err")" = 1

# --- a real interface, named by MT_SOCKET_IFNAME or reached by --master_addr: two nodes start, and
# the store and UCX listen there only --------------------------------------------------------------
read -r ifname ifaddr < <(ip -4 -o addr show 2>/dev/null |
    awk '$2 != "lo" { split($4, a, "/"); print $2, a[1]; exit }')
if [ -z "${ifname:-}" ]; then
    echo "skip: no interface besides lo with an IPv4 address for MT_SOCKET_IFNAME"
else
    # With MT_SOCKET_IFNAME, and without it: then the address that reaches --master_addr.
    for ifvar in "MT_SOCKET_IFNAME=$ifname" "MT_SOCKET_IFNAME="; do
        port=$(free_port)
        NODES=(--nnodes 2 --nproc_per_node 1 --master_addr "$ifaddr" --master_port "$port" --rdzv_id if)
        start_bg i0 env "$ifvar" MT_STORE_TOKEN=$TOKEN_A MT_TIMEOUT_S=30 "$MTRUN" \
            "${NODES[@]}" --node_rank 0 "$PROG" --hold 4 --marker "$MARKER"
        start_bg i1 env "$ifvar" MT_STORE_TOKEN=$TOKEN_A MT_TIMEOUT_S=30 "$MTRUN" \
            "${NODES[@]}" --node_rank 1 "$PROG" --hold 4 --marker "$MARKER"
        if wait_ranks i0 1 && wait_ranks i1 1; then
            listeners "$PID_i0" >"$TMP/i0.listen"
            check "$ifvar: node 0's store listens on $ifaddr only" only_addr "$ifaddr" "$TMP/i0.listen"
            # shellcheck disable=SC2046 # one pid per word
            listeners $(pgrep -P "$PID_i0") $(pgrep -P "$PID_i1") >"$TMP/i.ranks.listen"
            check "$ifvar: the ranks' UCX listens on $ifaddr only ($(tr '\n' ' ' <"$TMP/i.ranks.listen"))" \
                only_addr "$ifaddr" "$TMP/i.ranks.listen"
        fi
        expect_rc i0 0 40
        expect_rc i1 0 40
        [ "$FAILURES" = 0 ] || { show i0; show i1; }
    done
fi

check "no leftovers" no_leftovers 10
finish
