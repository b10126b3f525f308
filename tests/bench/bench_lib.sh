# Helpers of the bench smoke tests (sourced after tests/lib.sh).

# refuses_options BENCH PROG OPTIONS...: each OPTIONS word list (one string, split on spaces)
# must make BENCH exit 2 with a message starting "PROG:" on stderr and nothing on stdout.
refuses_options() {
    local bench=$1 prog=$2 bad rc
    shift 2
    for bad in "$@"; do
        # shellcheck disable=SC2086
        "$bench" $bad >"$TMP/bad.out" 2>"$TMP/bad.err"
        rc=$?
        if [ "$rc" -ne 2 ] || [ -s "$TMP/bad.out" ] || ! grep -q "^$prog:" "$TMP/bad.err"; then
            fail "'$bad' exited $rc (want 2, a message on stderr, nothing on stdout):" \
                 "$(head -3 "$TMP/bad.err")"
        else
            pass "'$bad' refused: $(head -1 "$TMP/bad.err")"
        fi
    done
}
