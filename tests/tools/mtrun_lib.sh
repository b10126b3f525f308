# Helpers for mtrun's test scripts (sourced), on top of lib.sh. Usage of a script:
#   mtrun_<name>.sh MTRUN WORKER FREEPORT
# Every process a test starts carries $MARKER in its command line, so that leftovers are found
# with pgrep -f and killed when the script ends, whatever happened.
set -u
MTRUN=$1
WORKER=$2
FREEPORT=$3
MARKER="mtrun_test_${$}_${RANDOM}${RANDOM}"
TMP_PREFIX=mtrun_test
SHOW_WIDTH=200
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

free_port() { "$FREEPORT"; }

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
