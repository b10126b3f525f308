# Shared helpers for the runtime's multi-process scripts (sourced). Usage of a script:
#   runtime_<name>.sh PROG_INIT [MTRUN]
# Ranks are started by hand (RANK/WORLD_SIZE/MASTER_PORT in their environment) in the
# background; every pid this script starts is killed when it ends, whatever happened.
set -u
PROG=$1
TMP=$(mktemp -d "${TMPDIR:-/tmp}/runtime_test.XXXXXX")
FAILURES=0
PIDS=()

cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$TMP"
}
trap cleanup EXIT

# A clean launch environment: only what each test sets.
for v in $(compgen -e); do
    case $v in
    RANK | WORLD_SIZE | LOCAL_RANK | LOCAL_WORLD_SIZE | GROUP_RANK | MASTER_ADDR | MASTER_PORT | \
        MT_RDZV_ID | TORCHELASTIC_RUN_ID | MT_NNODES | MT_STORE_HOSTED | MT_TIMEOUT_S | SLURM_*)
        unset "$v" ;;
    esac
done
export MT_DEVICE=cpu

fail() {
    echo "FAIL: $*" >&2
    FAILURES=$((FAILURES + 1))
}
pass() { echo "ok: $*"; }

# start NAME VAR=VALUE...: starts PROG with those variables; output in $TMP/NAME.out/.err,
# pid in PID_NAME
start() {
    local name=$1
    shift
    env "$@" "$PROG" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    local pid=$!
    PIDS+=("$pid")
    printf -v "PID_$name" '%s' "$pid"
}

# wait_rc PID SECONDS: sets RC to the exit code, or "timeout" (after killing it)
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

# expect_rc NAME WANT SECONDS: WANT is "0" or "nonzero"
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

# expect_text NAME out|err TEXT: the rank's stdout or stderr contains TEXT
expect_text() {
    if grep -qF -- "$3" "$TMP/$1.$2"; then
        pass "$1 $2 has '$3'"
    else
        fail "$1 $2 lacks '$3'"
        show "$1"
    fi
}

show() {
    echo "--- $1 stdout" >&2; cut -c1-300 "$TMP/$1.out" >&2
    echo "--- $1 stderr" >&2; cut -c1-300 "$TMP/$1.err" >&2
}

free_port() { "$PROG" --free-port; }

finish() {
    if [ "$FAILURES" -ne 0 ]; then
        echo "$FAILURES check(s) failed" >&2
        exit 1
    fi
    echo "all checks passed"
    exit 0
}
