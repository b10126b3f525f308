#!/usr/bin/env bash
# Multi-node jobs on hosts that are really separate (netns_lib.sh: network and UTS namespaces
# joined by a bridge, one mtrun per host, UCX over tcp between hosts), and the failures of a
# host. Issue 18, items 4 and 5.
# usage: multihost.sh MTRUN TRAIN_GPT VARIANT
#   train2 train3   dp N x tp 2 over N hosts of 2 ranks: every rank names its own host, each
#                   host's eth0 carried at least the dp collectives' bytes, and the step losses
#                   and gradient norms equal, bit for bit, the same mesh's run on one host
#   train2_ifname train3_ifname   the same with MT_SOCKET_IFNAME=eth0 on every host
#   cut_link_nodeK cut_nft_nodeK  3 hosts of 1 rank train; host K's link is cut without a reset
#                   (eth0 down, or an nftables drop): every other mtrun exits non-zero within
#                   MT_TIMEOUT_S + 10 s naming node K, and no process is left on any host
#   kill_node0_sigkill kill_node0_sighup   node 0's mtrun (the store's host) gets the signal: the
#                   others exit non-zero within MT_TIMEOUT_S + 10 s naming node 0, nothing is left
#                   (SIGHUP: node 0 also says it received it, as it does for SIGTERM)
#   abuse           a 4-rank job (2 hosts x 2) trains while a third host opens 500 connections to
#                   the store that send garbage and oversized frames: the job completes with the
#                   losses of an undisturbed run, node 0's mtrun (the store) grows by less than
#                   ABUSE_RSS_LIMIT_MIB, every abusive connection is closed, and the log about
#                   them is rate-limited (at most ABUSE_LOG_LINES lines)
# Each failure case prints how long each mtrun took to come down ("... exited N after S s").
set -u
MTRUN=$1
PROG=$2
VARIANT=$3
TMP_PREFIX=multihost
HERE=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
. "$HERE/../lib.sh"
. "$HERE/netns_lib.sh"
case $VARIANT in cut_nft_*) netns_require nft ;; *) netns_require ;; esac

# Short, so that a failure case takes seconds; long enough for 2 busy cores to start 6 ranks.
# multihost.cmake runs the failure cases with 10: below UCX's endpoint timeout (~16-18 s on
# tcp), so that mtrun's heartbeat notices a cut host before a rank's transport error does (with
# 20, a rank on a healthy host may fail first, blaming another healthy host).
export MT_TIMEOUT_S=${MT_TIMEOUT_S:-20} MT_DEVICE=cpu
# Between hosts UCX may use tcp only (and self); no UCX_NET_DEVICES: UCX finds eth0 itself.
export UCX_TLS=tcp,self
unset UCX_NET_DEVICES MT_SOCKET_IFNAME
PORT=29500 # the hosts are this run's alone: no other test can hold the port there
TINY=(--layers 2 --d-model 32 --heads 4 --seq 16 --lr 1e-2 --seed 7)
# Slack granted beyond MT_TIMEOUT_S for the others to come down (issue 18)
SLACK=10
ABUSE_CONNECTIONS=500
# 500 pre-handshake frames of at most 1 KiB and the bookkeeping of as many clients take well
# under 1 MiB; a store that buffers the oversized frames holds 250 x 256 KiB = 62.5 MiB.
ABUSE_RSS_LIMIT_MIB=16
ABUSE_LOG_LINES=20
# how long the abusive client waits for the store to close its connections: a store that bounds
# pre-handshake frames closes each within milliseconds of its first bytes
ABUSE_WAIT_S=8

# seconds_since T0: seconds (2 decimals) since the `date +%s.%N` value T0
seconds_since() { awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.2f", t1 - t0 }'; }

# job NAME NHOSTS NPROC ARGS...: one mtrun per host (NAME_node<i> on host i), rendezvous at host
# 0's eth0 address; rank 0's metrics in $TMP/NAME.jsonl; ARGS go to train_gpt
job() {
    local name=$1 nhosts=$2 nproc=$3 i
    shift 3
    for ((i = 0; i < nhosts; i++)); do
        local extra=()
        [ "$i" = 0 ] && extra=(--metrics "$TMP/$name.jsonl")
        host_bg "${name}_node$i" "$i" "$MTRUN" --nnodes "$nhosts" --nproc_per_node "$nproc" \
            --master_addr "${NETNS_ADDR[0]}" --master_port "$PORT" --rdzv_id "$name" \
            --node_rank "$i" "$PROG" "$@" "${extra[@]}"
    done
}

# reference NAME NRANKS ARGS...: the same program on one host (host 0, --standalone)
reference() {
    local name=$1 np=$2
    shift 2
    host_bg "$name" 0 env -u UCX_TLS "$MTRUN" --standalone --nproc_per_node "$np" "$PROG" "$@" \
        --metrics "$TMP/$name.jsonl"
    expect_rc "$name" 0 200
}

# bitwise REF NAME: NAME's step losses and gradient norms are REF's, as printed (9 significant
# digits: every bit of an f32), with as many steps, and the loss moved
bitwise() {
    if python3 - "$TMP/$1.jsonl" "$TMP/$2.jsonl" "$2 vs $1" <<'EOF'; then
import json, sys
ref_path, got_path, label = sys.argv[1:4]
def steps(path):
    try:
        return [json.loads(l, parse_float=str) for l in open(path) if '"loss"' in l]
    except FileNotFoundError:
        return []
ref, got = steps(ref_path), steps(got_path)
if len(ref) != len(got) or not ref:
    sys.exit(f"{label}: {len(got)} steps against {len(ref)}")
for a, b in zip(ref, got):
    for key in ("loss", "grad_norm"):
        if a[key] != b[key]:
            sys.exit(f"{label}: step {a['step']} {key} {b[key]} against {a[key]}")
if not float(ref[-1]["loss"]) < float(ref[0]["loss"]):
    sys.exit(f"{label}: the loss did not move")
print(f"{label}: {len(ref)} steps, losses and gradient norms equal bit for bit")
EOF
        pass "$2: equal to the run on one host bit for bit"
    else
        fail "$2: differs from the run on one host"
    fi
}

# train HOSTS [ifname]: dp HOSTS x tp 2 over HOSTS hosts (see the top)
train() {
    local nhosts=$1 ifname=${2:-} steps=10 i
    netns_setup "$nhosts" || return
    [ -z "$ifname" ] || export MT_SOCKET_IFNAME=eth0
    local mesh=(--dp "$nhosts" --tp 2 --batch 2 --steps "$steps")
    local before=() after=()
    for ((i = 0; i < nhosts; i++)); do before+=("$(link_bytes "$i")"); done
    job run "$nhosts" 2 "${TINY[@]}" "${mesh[@]}"
    expect_rc run_node0 0 120
    for ((i = 1; i < nhosts; i++)); do expect_rc "run_node$i" 0 30; done
    unset MT_SOCKET_IFNAME
    for ((i = 0; i < nhosts; i++)); do after+=("$(link_bytes "$i")"); done
    check "run: mesh dp $nhosts x tp 2 on $nhosts node(s)" has_text "$TMP/run_node0.out" \
        "mesh {\"dp\": $nhosts, \"tp\": 2} over $((2 * nhosts)) ranks on $nhosts node(s), 2 rank(s) per node"
    # rank r runs on host r / 2: the rank table names each host (its own UTS namespace)
    for ((i = 0; i < 2 * nhosts; i++)); do
        check "rank $i ran on mthost$((i / 2))" grep -qE \
            "^\[rank0\]:  $i +[0-9]+ +[0-9]+ +mthost$((i / 2))[/ ]" "$TMP/run_node0.out"
    done
    # TCP carried the collectives: FSDP all-gathers the parameters and reduce-scatters the f32
    # gradients over each dp group, whose ranks are on different hosts; per step a host receives
    # (and sends) at least (dp - 1) / dp of the parameters' bytes for each, so
    # 2 x steps x (dp - 1) / dp x 4 x params bytes cross each host's eth0 both ways.
    local params
    params=$(sed -n 's/.*vocab [0-9]*: \([0-9]*\) parameters;.*/\1/p' "$TMP/run_node0.out" | head -n 1)
    if [ -z "$params" ]; then
        fail "run: no parameter count printed"
    else
        local want=$((2 * steps * (nhosts - 1) * 4 * params / nhosts))
        for ((i = 0; i < nhosts; i++)); do
            local rx0 tx0 rx1 tx1
            read -r rx0 tx0 <<<"${before[$i]}"
            read -r rx1 tx1 <<<"${after[$i]}"
            check "host $i's eth0 received $((rx1 - rx0)) B and sent $((tx1 - tx0)) B, each >= $want B of dp collectives ($params parameters)" \
                test $((rx1 - rx0)) -ge "$want" -a $((tx1 - tx0)) -ge "$want"
        done
    fi
    reference ref $((2 * nhosts)) "${TINY[@]}" "${mesh[@]}"
    bitwise ref run
}

# watch_exits T0 DEADLINE NAME...: waits until each named mtrun has exited or DEADLINE seconds
# have passed since T0; sets EXIT_RC_<NAME> and EXIT_S_<NAME> (exit code or "running", and the
# seconds since T0) and prints them
watch_exits() {
    local t0=$1 deadline=$2 name left
    shift 2
    local names=("$@")
    for name in "${names[@]}"; do printf -v "EXIT_RC_$name" running; done
    while :; do
        left=0
        for name in "${names[@]}"; do
            local rc_var="EXIT_RC_$name" pid_var="PID_$name"
            [ "${!rc_var}" = running ] || continue
            if kill -0 "${!pid_var}" 2>/dev/null; then
                left=$((left + 1))
            else
                wait "${!pid_var}"
                printf -v "EXIT_RC_$name" '%s' "$?"
                printf -v "EXIT_S_$name" '%s' "$(seconds_since "$t0")"
            fi
        done
        [ "$left" = 0 ] && break
        [ "$(awk -v s="$(seconds_since "$t0")" -v d="$deadline" 'BEGIN { print (s > d) }')" = 1 ] && break
        sleep 0.1
    done
    for name in "${names[@]}"; do
        local rc_var="EXIT_RC_$name" s_var="EXIT_S_$name"
        if [ "${!rc_var}" = running ]; then
            echo "measured: $name still running $deadline s after the failure"
        else
            echo "measured: $name exited ${!rc_var} after ${!s_var} s"
        fi
    done
}

# failure KIND VICTIM: 3 hosts of 1 rank train until host VICTIM fails by KIND (cut_link,
# cut_nft, sigkill, sighup); the others must come down in time naming node VICTIM
failure() {
    local kind=$1 victim=$2 i t0
    netns_setup 3 || return
    # steps enough to outlast any failure case: the job ends only by the failure
    job run 3 1 "${TINY[@]}" --dp 3 --batch 2 --steps 1000000
    # rank 0 (node 0) prints the steps; each needs every rank, so all three hosts train
    if ! wait_for_text "$TMP/run_node0.out" "]:step     2 " 120; then
        fail "the job does not train"
        for i in 0 1 2; do show "run_node$i"; done
        return
    fi
    pass "the job trains on 3 hosts"
    t0=$(date +%s.%N)
    case $kind in
    cut_link) cut_link "$victim" ;;
    cut_nft) cut_nft "$victim" ;;
    sigkill) kill -KILL "$PID_run_node0" ;;
    sighup) kill -HUP "$PID_run_node0" ;;
    esac
    echo "node $victim: $kind at $(date -u +%T.%N | cut -c1-12)"
    local others=() limit=$((MT_TIMEOUT_S + SLACK))
    for i in 0 1 2; do [ "$i" = "$victim" ] || others+=("run_node$i"); done
    # The victim's own mtrun is watched too (when it still runs), for the record: cut off, it
    # must notice the store's silence itself, which takes up to 2 x MT_TIMEOUT_S on main.
    watch_exits "$t0" $((2 * MT_TIMEOUT_S + SLACK)) "${others[@]}" "run_node$victim"
    for i in 0 1 2; do
        [ "$i" = "$victim" ] && continue
        local rc_var="EXIT_RC_run_node$i" s_var="EXIT_S_run_node$i"
        if [ "${!rc_var}" = running ]; then
            fail "node $i: still running $((2 * MT_TIMEOUT_S + SLACK)) s after node $victim's $kind"
        elif [ "${!rc_var}" = 0 ]; then
            fail "node $i: exited 0 after node $victim's $kind"
        else
            check "node $i: exited ${!rc_var} within MT_TIMEOUT_S + $SLACK = $limit s (after ${!s_var} s)" \
                awk -v s="${!s_var}" -v l="$limit" 'BEGIN { exit !(s <= l) }'
        fi
        check "node $i names node $victim: $(grep '^mtrun: ' "$TMP/run_node$i.err" | tail -n 1)" \
            grep -qE "^mtrun: .*node $victim([^0-9]|$)" "$TMP/run_node$i.err"
    done
    if [ "$kind" = sighup ]; then
        check "node 0 says it received SIGHUP" has_line "$TMP/run_node0.err" \
            "mtrun: node 0 received SIGHUP; stopping the job"
    fi
    check "no process left on any host (ranks and mtrun)" hosts_empty 10
    [ "$FAILURES" = 0 ] || for i in 0 1 2; do show "run_node$i"; done
}

# vm_kib PID FIELD: a /proc/PID/status field in KiB (VmRSS, VmHWM)
vm_kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null; }

abuse() {
    # 6000 steps of the tiny model take about 30 s here: well beyond the abuse (ABUSE_WAIT_S at
    # most), which must end while the job still trains (checked)
    local steps=6000 s0 hwm0 hwm1 rss_peak=0 rss
    netns_setup 3 || return
    local mesh=(--dp 2 --tp 2 --batch 2 --steps "$steps")
    job run 2 2 "${TINY[@]}" "${mesh[@]}"
    if ! wait_for_text "$TMP/run_node0.out" "]:step     2 " 120; then
        fail "the job does not train"
        show run_node0
        show run_node1
        return
    fi
    hwm0=$(vm_kib "$PID_run_node0" VmHWM)
    s0=$(grep -c ']:step ' "$TMP/run_node0.out")
    local lines0
    lines0=$(wc -l <"$TMP/run_node0.err")
    host_bg abuser 2 python3 "$HERE/store_abuse.py" "${NETNS_ADDR[0]}" "$PORT" \
        "$ABUSE_CONNECTIONS" "$ABUSE_WAIT_S"
    # the store's resident memory while the abuse goes on (its peak also shows in VmHWM)
    while kill -0 "$PID_abuser" 2>/dev/null; do
        rss=$(vm_kib "$PID_run_node0" VmRSS)
        [ -n "$rss" ] && [ "$rss" -gt "$rss_peak" ] && rss_peak=$rss
        sleep 0.1
    done
    hwm1=$(vm_kib "$PID_run_node0" VmHWM)
    local s1 still
    s1=$(grep -c ']:step ' "$TMP/run_node0.out")
    kill -0 "$PID_run_node0" 2>/dev/null && still=1 || still=0
    expect_rc abuser 0 5
    local summary
    summary=$(tail -n 1 "$TMP/abuser.out")
    echo "measured: abuse: $summary"
    echo "measured: node 0's mtrun (the store): VmHWM $hwm0 KiB before, ${hwm1:-?} KiB after" \
        "(peak VmRSS sampled during the abuse $rss_peak KiB); steps $s0 .. $s1 of $steps ran during it"
    check "the abuse ran while the job trained (steps $s0 .. $s1; raise steps if not)" \
        test "$still" = 1 -a "$s1" -gt "$s0"
    expect_rc run_node0 0 200
    expect_rc run_node1 0 30
    if [ -n "${hwm1:-}" ] && [ -n "$hwm0" ]; then
        check "the store grew by $(((hwm1 - hwm0) / 1024)) MiB (VmHWM), under $ABUSE_RSS_LIMIT_MIB MiB" \
            test $((hwm1 - hwm0)) -lt $((ABUSE_RSS_LIMIT_MIB * 1024))
    else
        fail "no VmHWM of node 0's mtrun (pid $PID_run_node0)"
    fi
    check "every abusive connection connected and was closed by the store" python3 -c '
import json, sys
s = json.loads(sys.argv[1]); n = int(sys.argv[2])
sys.exit(not (s["refused"] == 0 and s["closed_by_server"] == n and s["left_open"] == 0))' \
        "$summary" "$ABUSE_CONNECTIONS"
    # The store's lines about them: those naming the abuser's address, or speaking of the store's
    # clients or connections, written since the abuse began
    local about
    about=$(tail -n +"$((lines0 + 1))" "$TMP/run_node0.err" |
        grep -cE "${NETNS_ADDR[2]//./\\.}([^0-9]|$)|store.*(client|connection)")
    echo "measured: node 0 logged $about line(s) about the abusive connections"
    check "the store said it closed abusive connections ($about line(s))" test "$about" -ge 1
    check "rate-limited: at most $ABUSE_LOG_LINES lines for $ABUSE_CONNECTIONS connections ($about)" \
        test "$about" -le "$ABUSE_LOG_LINES"
    reference ref 4 "${TINY[@]}" "${mesh[@]}"
    bitwise ref run
    [ "$FAILURES" = 0 ] || { show run_node0; show abuser; }
}

case $VARIANT in
train2) train 2 ;;
train3) train 3 ;;
train2_ifname) train 2 ifname ;;
train3_ifname) train 3 ifname ;;
cut_link_node0) failure cut_link 0 ;;
cut_link_node1) failure cut_link 1 ;;
cut_nft_node0) failure cut_nft 0 ;;
cut_nft_node1) failure cut_nft 1 ;;
kill_node0_sigkill) failure sigkill 0 ;;
kill_node0_sighup) failure sighup 0 ;;
abuse) abuse ;;
*) fail "unknown variant '$VARIANT'" ;;
esac
finish
