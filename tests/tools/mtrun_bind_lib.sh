# Helpers for the --bind test scripts (sourced), on top of lib.sh. Usage of a script:
#   mtrun_bind<name>.sh MTRUN PROG_BIND_REPORT FIXTURE_DIR
set -u
MTRUN=$1
PROG=$2
FIXTURES=$3
TMP_PREFIX=mtrun_bind
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# run NAME ARGS...: runs mtrun ARGS... in the foreground (bounded by timeout) with output in
# $TMP/NAME.out and $TMP/NAME.err; RC holds the exit code
run() {
    local name=$1
    shift
    timeout 60 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
    RC=$?
}

# field NAME RANK KEY: the value a rank printed as "KEY value" on stdout ("" when absent)
field() {
    sed -n "s/^\[rank$2\]:$3 //p" "$TMP/$1.out" | head -1
}

# bind_line NAME RANK: the binding line mtrun printed for the rank on stderr, without the prefix
bind_line() {
    sed -n "s/^\[rank$2\]: //p" "$TMP/$1.err" | head -1
}

# line_cpus LINE: the cpu list of "... (cpus L, ...)" or "... (cpus L)"
line_cpus() {
    sed -n 's/.*(cpus \([0-9,-]*\)[,;)].*/\1/p' <<<"$1"
}

# expand LIST: one cpu number per line ("0-2,5" -> 0 1 2 5)
expand() {
    local part lo hi
    local IFS=,
    for part in $1; do
        lo=${part%-*}
        hi=${part#*-}
        seq "$lo" "$hi"
    done
}

# ran_ok NAME: mtrun exited 0 (shows its output otherwise)
ran_ok() {
    if [ "$RC" = 0 ]; then
        pass "$1: exit 0"
    else
        fail "$1: exit $RC"
        show "$1"
    fi
}
