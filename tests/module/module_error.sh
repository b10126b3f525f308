#!/usr/bin/env bash
# A module error on one rank ends the whole job within 10 s with the default MT_TIMEOUT_S
# (300 s), naming the rank and the module's message: under mtrun on 2 and 4 ranks, by hand on 2
# ranks (the failing rank being the store's host or not), and through mt_abort.
#   module_error.sh PROG MTRUN
set -u
PROG=$1
MTRUN=$2
TMP_PREFIX=module_error
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
for v in RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT MT_TIMEOUT_S; do
    unset "$v"
done
export MT_DEVICE=cpu
LIMIT=10
MESSAGE="token 300 is outside the vocabulary of 256 (a bug on purpose)"

# elapsed_ok NAME START: the run NAME ended within LIMIT seconds of START (START from now_s)
now_s() { date +%s.%N; }
elapsed_ok() {
    local took
    took=$(awk -v a="$2" -v b="$(now_s)" 'BEGIN { printf "%.1f", b - a }')
    echo "   $1 ended after $took s"
    awk -v t="$took" -v l="$LIMIT" 'BEGIN { exit !(t <= l) }'
}

# wait_for NAME: waits (at most 60 s, so that a regression fails instead of hanging) and
# leaves the exit code in RC
wait_for() {
    local pid_var="PID_$1" i
    for ((i = 0; i < 600; i++)); do
        kill -0 "${!pid_var}" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "${!pid_var}" 2>/dev/null
    wait "${!pid_var}" 2>/dev/null
    RC=$?
}

for np in 2 4; do
    name=mtrun$np
    start=$(now_s)
    start_bg "$name" "$MTRUN" --standalone --nproc_per_node "$np" "$PROG" --fail-rank 1
    wait_for "$name"
    check "mtrun $np ranks: the job ends within $LIMIT s" elapsed_ok "$name" "$start"
    check "mtrun $np ranks: it fails (exit $RC)" test "$RC" -ne 0
    check "mtrun $np ranks: rank 1's message, with the module" has_text "$TMP/$name.err" \
        "[rank1]:prog_module_error: rank 1: forward of module 'fc1': $MESSAGE"
    check "mtrun $np ranks: mtrun names rank 1" has_text "$TMP/$name.err" "mtrun: rank 1"
done

# by_hand NAME FAIL ARGS...: ranks 0 and 1 started by hand (rank 0 hosts the store), rank FAIL
# failing; both must end within LIMIT seconds with exit code 1. Output in $TMP/NAME_<rank>.err.
by_hand() {
    local name=$1 fail=$2 port start r
    shift 2
    port=$(free_port)
    start=$(now_s)
    for r in 0 1; do
        start_bg "${name}_$r" env RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
            MASTER_PORT="$port" "$PROG" --fail-rank "$fail" "$@"
    done
    for r in 0 1; do
        wait_for "${name}_$r"
        check "$name: rank $r ends within $LIMIT s" elapsed_ok "${name}_$r" "$start"
        check "$name: rank $r exits 1 (got $RC)" test "$RC" = 1
    done
}

# By hand: the failing rank publishes its error; the other rank's all-reduce stops with it.
for fail in 1 0; do
    other=$((1 - fail))
    by_hand "hand$fail" "$fail"
    check "by hand, rank $fail failing: its own message" has_text "$TMP/hand${fail}_$fail.err" \
        "rank $fail: forward of module 'fc1': $MESSAGE"
    check "by hand, rank $fail failing: rank $other stops with rank $fail's message" \
        has_text "$TMP/hand${fail}_$other.err" \
        "the job was aborted: rank $fail: forward of module 'fc1': $MESSAGE"
done

# Failing before mt_mesh_create, where the others wait in the store for every rank's arguments.
for fail in 1 0; do
    other=$((1 - fail))
    by_hand "mesh$fail" "$fail" --before-mesh
    check "before the mesh, rank $fail failing: rank $other stops with its message" \
        has_text "$TMP/mesh${fail}_$other.err" "mt_mesh_create: stopped because the job was \
aborted: rank $fail: the configuration is unreadable"
done

# mt_abort: exits with the status as its code (MT_ERR_INVALID_ARG = 1), the others stop too.
start=$(now_s)
start_bg abort "$MTRUN" --standalone --nproc_per_node 2 "$PROG" --fail-rank 0 --abort
wait_for abort
check "mt_abort under mtrun: the job ends within $LIMIT s" elapsed_ok abort "$start"
check "mt_abort under mtrun: exit code 1 (got $RC)" test "$RC" = 1
check "mt_abort: the message is logged" has_text "$TMP/abort.err" "aborting the job: rank 0: forward of module 'fc1': $MESSAGE"

# An error handled with mt_clear_error is no failure: every rank ends normally.
start_bg recover "$MTRUN" --standalone --nproc_per_node 2 "$PROG" --recover-rank 1
wait_for recover
check "a handled error: the job succeeds (exit $RC)" test "$RC" = 0
check "a handled error: no abort" bash -c "! grep -q 'aborted' '$TMP/recover.err'"

if [ "$FAILURES" -ne 0 ]; then
    for f in "$TMP"/*.out "$TMP"/*.err; do echo "== $f"; head -c 3000 "$f"; done
fi
echo "module_error: $FAILURES failure(s)"
exit $((FAILURES > 0))
