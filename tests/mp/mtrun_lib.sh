# Shared helpers for mtrun's test scripts (sourced). Usage of a script:
#   mtrun_<name>.sh MTRUN WORKER FREEPORT
# Every process a test starts carries $MARKER in its command line, so that leftovers are found
# with pgrep -f and killed when the script ends, whatever happened.
set -u
MTRUN=$1
WORKER=$2
FREEPORT=$3
MARKER="mtrun_test_${$}_${RANDOM}${RANDOM}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mtrun_test.XXXXXX")
FAILURES=0
BG_PIDS=()

cleanup() {
    for p in "${BG_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    pkill -9 -f -- "$MARKER" 2>/dev/null
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

free_port() { "$FREEPORT"; }

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

# wait_for_text FILE TEXT SECONDS: waits until FILE contains TEXT
wait_for_text() {
    local t=0
    while ! grep -qF -- "$2" "$1" 2>/dev/null; do
        [ "$t" -ge $(($3 * 10)) ] && return 1
        sleep 0.1
        t=$((t + 1))
    done
}

# no_leftovers SECONDS: true once no process carries $MARKER, waiting at most SECONDS
no_leftovers() {
    local t=0
    while pgrep -f -- "$MARKER" >/dev/null; do
        if [ "$t" -ge $(($1 * 10)) ]; then
            echo "still alive:" >&2
            pgrep -af -- "$MARKER" >&2
            return 1
        fi
        sleep 0.1
        t=$((t + 1))
    done
}

# show NAME: prints a background command's output (for diagnosing a failure)
show() {
    echo "--- $1 stdout" >&2; cut -c1-200 "$TMP/$1.out" >&2
    echo "--- $1 stderr" >&2; cut -c1-200 "$TMP/$1.err" >&2
}

finish() {
    if [ "$FAILURES" -ne 0 ]; then
        echo "$FAILURES check(s) failed" >&2
        exit 1
    fi
    echo "all checks passed"
    exit 0
}
