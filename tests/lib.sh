# Helpers shared by the multi-process test scripts (sourced by mtrun_lib.sh and runtime_lib.sh,
# which set TMP_PREFIX, and SHOW_WIDTH if they want another width, before sourcing this file).
# Background commands write to $TMP/NAME.out and $TMP/NAME.err; every pid started here is killed
# when the script ends, whatever happened, and so is every process carrying $MARKER if the
# script sets one.
set -u
TMP=$(mktemp -d "${TMPDIR:-/tmp}/${TMP_PREFIX}.XXXXXX")
FAILURES=0
BG_PIDS=()
SHOW_WIDTH=${SHOW_WIDTH:-300}

cleanup() {
    for p in "${BG_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    [ -z "${MARKER:-}" ] || pkill -9 -f -- "$MARKER" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

fail() {
    echo "FAIL: $*" >&2
    FAILURES=$((FAILURES + 1))
}
pass() { echo "ok: $*"; }

# check DESCRIPTION COMMAND...: runs the command, counts a failure when it fails
check() {
    local what=$1
    shift
    if "$@"; then pass "$what"; else fail "$what"; fi
}

# has_line FILE TEXT: FILE contains TEXT as a whole line
has_line() { grep -qxF -- "$2" "$1"; }
# has_text FILE TEXT: FILE contains TEXT somewhere
has_text() { grep -qF -- "$2" "$1"; }

# start_bg NAME CMD...: starts CMD in the background with stdout/stderr in $TMP/NAME.out/.err;
# its pid is in the variable PID_<NAME>
start_bg() {
    local name=$1
    shift
    "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    local pid=$!
    BG_PIDS+=("$pid")
    printf -v "PID_$name" '%s' "$pid"
}

# free_port: prints a TCP port of 127.0.0.1 that is free now (mtrun_lib.sh and runtime_lib.sh
# define their own, through their test programs)
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start_node NAME NODE_RANK PORT ARGS...: starts (as start_bg NAME) one of two "$MTRUN" on
# 127.0.0.1 that form one job of 2 nodes with 2 ranks each, its rendezvous at PORT; ARGS are the
# program and its arguments
start_node() {
    local name=$1 node=$2 port=$3
    shift 3
    start_bg "$name" "$MTRUN" --nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1 \
        --master_port "$port" --rdzv_id "two-nodes-$port" --node_rank "$node" "$@"
}

# wait_rc PID SECONDS: waits for a background child and sets RC to its exit code, or to
# "timeout" (after killing it) when it runs longer than SECONDS. Not in $(...): a subshell cannot
# wait for this shell's children.
wait_rc() {
    local pid=$1 limit=$2 t=0
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$t" -ge $((limit * 10)) ]; then
            kill -9 "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            RC=timeout
            return
        fi
        sleep 0.1
        t=$((t + 1))
    done
    wait "$pid"
    RC=$?
}

# expect_rc NAME WANT SECONDS: waits for start_bg's NAME; WANT is "0" or "nonzero"
expect_rc() {
    local name=$1 want=$2 limit=$3 pid_var="PID_$1"
    wait_rc "${!pid_var}" "$limit"
    if [ "$RC" = timeout ]; then
        fail "$name still running after $limit s"
        show "$name"
    elif [ "$want" = 0 ] && [ "$RC" -ne 0 ]; then
        fail "$name exited with $RC, expected 0"
        show "$name"
    elif [ "$want" = nonzero ] && [ "$RC" -eq 0 ]; then
        fail "$name exited with 0, expected a failure"
        show "$name"
    else
        pass "$name exited with $RC"
    fi
}

# expect_text NAME out|err TEXT: start_bg's NAME wrote TEXT on its stdout or stderr
expect_text() {
    if grep -qF -- "$3" "$TMP/$1.$2"; then
        pass "$1 $2 has '$3'"
    else
        fail "$1 $2 lacks '$3'"
        show "$1"
    fi
}

# wait_for_text FILE TEXT SECONDS: waits until FILE contains TEXT
wait_for_text() {
    local t=0
    while ! grep -qF -- "$2" "$1" 2>/dev/null; do
        [ "$t" -ge $(($3 * 10)) ] && return 1
        sleep 0.1
        t=$((t + 1))
    done
}

# show NAME: prints a background command's output (for diagnosing a failure)
show() {
    echo "--- $1 stdout" >&2; cut -c1-"$SHOW_WIDTH" "$TMP/$1.out" >&2
    echo "--- $1 stderr" >&2; cut -c1-"$SHOW_WIDTH" "$TMP/$1.err" >&2
}

finish() {
    if [ "$FAILURES" -ne 0 ]; then
        echo "$FAILURES check(s) failed" >&2
        exit 1
    fi
    echo "all checks passed"
    exit 0
}
