#!/usr/bin/env bash
# mtrun test: the flight recorder's diagnosis (docs/flight-recorder.md), with prog_fr_loop (a
# {"dp","tp"} loop of all_gathers and all_reduces):
#   A. one rank of four SIGSTOPped, MT_TIMEOUT_S=5: the others time out and mtrun's diagnosis
#      names the stopped rank first, as stopped; the rings are written as JSON lines into
#      --log_dir; the ring files are removed when mtrun ends;
#   B. a rank issues a reduce_scatter where its dp peer issues an all_gather of the same sizes:
#      the two wait (the host backend's messages carry the operation) while `mtrun --diagnose=PID`
#      and SIGUSR1 both name the disagreement; then they time out, the job fails, and the
#      automatic diagnosis names the disagreement and calls nobody behind;
#   C. SIGUSR1 to a healthy job: "no rank is behind", and the job finishes with 0;
#   D. MT_FLIGHT_RECORDER=0: no ring files, SIGUSR1 says the recorder is off; out of range: exit 2;
#      ring files left by an mtrun that is gone (SIGKILLed) are removed by the next mtrun, those of
#      a live one are kept, and so are those held by a live process's lock (another pid namespace);
#   E. two nodes: SIGUSR1 to node 1 makes node 0 print the diagnosis of all 4 ranks; then a rank
#      of node 1 stopped: node 0's diagnosis names it, with its node;
#   F. two nodes, SIGUSR1 to both at once: node 0 prints both diagnoses, each of all 4 ranks and
#      without waiting for a node (a node used to skip the other's request: "without node 1"
#      after 10 s, or one diagnosis never printed), and they leave no key in the store;
#   G. three nodes, the mtruns of nodes 1 and 2 stopped: node 0's diagnosis goes without them
#      after one 10 s deadline for both (it was 10 s per node); once they go on, they find that
#      node 0 stopped waiting, say so and remove their late summaries: no key left;
#   H. SIGUSR1 to a node waiting for the others to join: no ranks run, and it says so (the signal
#      used to be dropped without a word).
# The diagnosis lines are printed ("diagnosis: ...") for the record.
. "$(dirname "$0")/mtrun_lib.sh"
LOOP="$(dirname "$WORKER")/prog_fr_loop"
export MT_KILL_GRACE_S=1

print_diagnosis() { grep -h -A4 "flight recorder diagnosis" "$@" | sed 's/^/diagnosis: /'; }
rings_of() { ls /dev/shm 2>/dev/null | grep -c "^mt-fr-$1-"; }

# A
mkdir -p "$TMP/pids_a" "$TMP/logs_a"
FR_PID_DIR=$TMP/pids_a MT_TIMEOUT_S=5 start_bg stop "$MTRUN" --standalone --nproc_per_node 4 \
    --log_dir "$TMP/logs_a" "$LOOP" loop 100000 10 "$MARKER"
check "A: the loop runs" wait_for_text "$TMP/stop.out" "[rank0]:iteration 20" 60
check "A: four ring files while it runs" test "$(rings_of "$PID_stop")" = 4
kill -STOP "$(cat "$TMP/pids_a/rank1.pid")"
wait_rc "$PID_stop" 60
check "A: the job fails (rc $RC)" bash -c "[ '$RC' != timeout ] && [ '$RC' != 0 ]"
print_diagnosis "$TMP/stop.err"
check "A: the diagnosis names the stopped rank first" \
    grep -qE "^mtrun:   rank 1 \(node 0\) is behind: [0-9]+ ranks? of group (tp|dp)#[0-9]+ waits? in (all_gather|all_reduce) seq [0-9]+ \([0-9.]+ KiB, for [0-9.]+ s\); rank 1's last completed is seq [0-9]+, [0-9.]+ s ago.*; its process is stopped$" \
    "$TMP/stop.err"
check "A: no other rank is named as a cause" \
    bash -c "! grep -E '^mtrun:   rank [023] ' '$TMP/stop.err'"
lines=$(ls "$TMP"/logs_a/*/flight_recorder/f0-node0.jsonl 2>/dev/null)
check "A: the rings as JSON lines in --log_dir" test -n "$lines"
check "A: every line is a JSON object, rank 1's records among them" python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert all(isinstance(r, dict) for r in rows)
heads = [r for r in rows if "recorded" in r]
assert sorted(r["rank"] for r in heads) == [0, 1, 2, 3], heads
assert [r["state"] for r in heads if r["rank"] == 1] == ["T"], heads
assert any(r.get("rank") == 1 and r.get("op") == "all_reduce" for r in rows)
' "${lines:-/nonexistent}"
check "A: the ring files are removed" test "$(rings_of "$PID_stop")" = 0

# B
MT_TIMEOUT_S=30 start_bg mm "$MTRUN" --standalone --nproc_per_node 4 "$LOOP" mismatch 0 8000 \
    "$MARKER"
check "B: the mismatched collective was issued" wait_for_text "$TMP/mm.out" \
    "[rank0]:mismatch issued" 60
"$MTRUN" --diagnose="$PID_mm" >"$TMP/diag_b.out" 2>&1
print_diagnosis "$TMP/diag_b.out"
WANT="ranks disagree at group dp#"
check "B: mtrun --diagnose names the disagreement" grep -qE \
    "^mtrun:   ranks disagree at group dp#[0-9]+ seq 10: rank 1 issued all_gather, rank 3 reduce_scatter$" \
    "$TMP/diag_b.out"
kill -USR1 "$PID_mm"
check "B: SIGUSR1 prints it too" wait_for_text "$TMP/mm.err" "$WANT" 10
print_diagnosis "$TMP/mm.err"
check "B: seq 10: rank 1 issued all_gather, rank 3 reduce_scatter" grep -qE \
    "seq 10: rank 1 issued all_gather, rank 3 reduce_scatter$" "$TMP/mm.err"
wait_rc "$PID_mm" 90
check "B: the mismatched ranks time out and the job fails (rc $RC)" \
    bash -c "[ '$RC' != timeout ] && [ '$RC' != 0 ]"
grep -A3 "diagnosis (rank" "$TMP/mm.err" | sed 's/^/diagnosis: /'
n=$(grep -cE "^mtrun:   ranks disagree at group dp#[0-9]+ seq 10: rank 1 issued all_gather, rank 3 reduce_scatter$" "$TMP/mm.err")
check "B: the diagnosis of the failure names the disagreement too (SIGUSR1's and its: $n)" \
    test "$n" = 2
check "B: ... and calls nobody behind" bash -c "! grep -q 'is behind' '$TMP/mm.err'"

# C
MT_TIMEOUT_S=30 start_bg ok "$MTRUN" --standalone --nproc_per_node 4 "$LOOP" loop 400 10 "$MARKER"
check "C: the loop runs" wait_for_text "$TMP/ok.out" "[rank0]:iteration 10" 60
kill -USR1 "$PID_ok"
check "C: SIGUSR1 prints a diagnosis" wait_for_text "$TMP/ok.err" "no rank is behind" 10
print_diagnosis "$TMP/ok.err"
check "C: of the 4 ranks, 4 groups" grep -qE \
    "^mtrun:   no rank is behind and no ranks disagree: 4 ranks, 4 groups, [0-9]+ collectives recorded" \
    "$TMP/ok.err"
expect_rc ok 0 90

# D
MT_FLIGHT_RECORDER=0 MT_TIMEOUT_S=30 start_bg off "$MTRUN" --standalone --nproc_per_node 2 \
    "$LOOP" loop 300 10 "$MARKER"
check "D: the loop runs" wait_for_text "$TMP/off.out" "[rank0]:iteration 10" 60
check "D: no ring files" test "$(rings_of "$PID_off")" = 0
kill -USR1 "$PID_off"
check "D: SIGUSR1 says the recorder is off" wait_for_text "$TMP/off.err" \
    "mtrun: received SIGUSR1, but the flight recorder is off (MT_FLIGHT_RECORDER=0): no diagnosis" 10
expect_rc off 0 90
MT_FLIGHT_RECORDER=-1 "$MTRUN" --standalone "$LOOP" loop 1 1 "$MARKER" >"$TMP/bad.out" 2>&1
rc=$?
check "D: MT_FLIGHT_RECORDER=-1 is refused with 2 (got $rc)" test "$rc" = 2
check "D: ... saying what is wrong" grep -qF \
    "MT_FLIGHT_RECORDER=-1 is not an integer in 0..1048576" "$TMP/bad.out"

# a dead pid: a child that has been waited for; a live one: this shell
sh -c 'exit 0' & dead=$!
wait "$dead"
: >"/dev/shm/mt-fr-$dead-0"
: >"/dev/shm/mt-fr-$dead-1"
: >"/dev/shm/mt-fr-$$-0"
# a gone pid whose file is held (a shared flock, as a live mtrun holds its rings): an mtrun in
# another pid namespace sharing /dev/shm looks gone from here
: >"/dev/shm/mt-fr-$dead-2"
flock -s "/dev/shm/mt-fr-$dead-2" sleep 60 & holder=$!
sleep 0.2
"$MTRUN" --standalone "$LOOP" loop 1 1 "$MARKER" >"$TMP/sweep.out" 2>&1
rc=$?
check "D: an mtrun after one that was killed runs (rc $rc)" test "$rc" = 0
check "D: ... and removes the dead mtrun's 2 ring files" bash -c \
    "[ ! -e /dev/shm/mt-fr-$dead-0 ] && [ ! -e /dev/shm/mt-fr-$dead-1 ]"
check "D: ... saying so" grep -qF \
    "mtrun: removed 2 flight recorder files of mtrun processes that are gone (/dev/shm/mt-fr-*)" \
    "$TMP/sweep.out"
check "D: ... and keeps a live process's" test -e "/dev/shm/mt-fr-$$-0"
check "D: ... and one held by a live process's lock" test -e "/dev/shm/mt-fr-$dead-2"
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
rm -f "/dev/shm/mt-fr-$$-0" "/dev/shm/mt-fr-$dead-"[012]

# E
mkdir -p "$TMP/pids_e"
port=$(free_port)
export FR_PID_DIR=$TMP/pids_e MT_TIMEOUT_S=6
start_node e0 0 "$port" "$LOOP" loop 100000 10 "$MARKER"
start_node e1 1 "$port" "$LOOP" loop 100000 10 "$MARKER"
unset FR_PID_DIR
check "E: the loop runs" wait_for_text "$TMP/e0.out" "[rank0]:iteration 20" 60
kill -USR1 "$PID_e1"
check "E: node 0 prints the diagnosis asked for on node 1" wait_for_text "$TMP/e0.err" \
    "flight recorder diagnosis (asked for with SIGUSR1 on" 15
check "E: ... of all 4 ranks" wait_for_text "$TMP/e0.err" \
    "no rank is behind and no ranks disagree: 4 ranks" 5
print_diagnosis "$TMP/e0.err"
kill -STOP "$(cat "$TMP/pids_e/rank3.pid")"
wait_rc "$PID_e0" 60
check "E: the job fails (rc $RC)" bash -c "[ '$RC' != timeout ] && [ '$RC' != 0 ]"
grep -A4 "diagnosis (rank" "$TMP/e0.err" | sed 's/^/diagnosis: /'
check "E: node 0 names the stopped rank of node 1" grep -qE \
    "^mtrun:   rank 3 \(node 1\) is behind: .*; its process is stopped$" "$TMP/e0.err"
wait_rc "$PID_e1" 30

# F
port=$(free_port)
export MT_TIMEOUT_S=30 FR_KEYS_WHEN=$TMP/f_look \
    FR_KEYS_GONE="mtrun/diag/u1/1 mtrun/diag/u2/1 mtrun/diag/u1/from mtrun/diag/u2/from"
start_node f0 0 "$port" "$LOOP" loop 100000 10 "$MARKER"
start_node f1 1 "$port" "$LOOP" loop 100000 10 "$MARKER"
unset FR_KEYS_WHEN FR_KEYS_GONE
check "F: the loop runs" wait_for_text "$TMP/f0.out" "[rank0]:iteration 20" 60
kill -USR1 "$PID_f1" "$PID_f0"
# wait_count FILE TEXT N SECONDS: FILE has N lines with TEXT within SECONDS
wait_count() {
    local t=0
    while [ "$(grep -cF -- "$2" "$1" 2>/dev/null)" -lt "$3" ]; do
        [ "$t" -ge $(($4 * 10)) ] && return 1
        sleep 0.1
        t=$((t + 1))
    done
}
check "F: node 0 prints two diagnoses of all 4 ranks" wait_count "$TMP/f0.err" \
    "no rank is behind and no ranks disagree: 4 ranks" 2 15
print_diagnosis "$TMP/f0.err"
check "F: ... neither without a node" bash -c "! grep -q 'without node' '$TMP/f0.err'"
touch "$TMP/f_look"
check "F: the diagnoses left no key in the store" wait_for_text "$TMP/f0.out" \
    "[rank0]:keys: all gone" 30
grep "keys:" "$TMP/f0.out"
kill -TERM "$PID_f0" "$PID_f1"
wait_rc "$PID_f0" 30
wait_rc "$PID_f1" 30

# G
port=$(free_port)
gnode() {
    local name=$1 node=$2
    shift 2
    start_bg "$name" "$MTRUN" --nnodes 3 --nproc_per_node 1 --master_addr 127.0.0.1 \
        --master_port "$port" --rdzv_id "three-nodes-$port" --node_rank "$node" "$@"
}
export MT_TIMEOUT_S=60 FR_KEYS_WHEN=$TMP/g_look \
    FR_KEYS_GONE="mtrun/diag/u1/1 mtrun/diag/u1/2 mtrun/diag/u1/from"
gnode g0 0 "$LOOP" loop 100000 10 "$MARKER"
gnode g1 1 "$LOOP" loop 100000 10 "$MARKER"
gnode g2 2 "$LOOP" loop 100000 10 "$MARKER"
unset FR_KEYS_WHEN FR_KEYS_GONE
check "G: the loop runs" wait_for_text "$TMP/g0.out" "[rank0]:iteration 20" 60
kill -STOP "$PID_g1" "$PID_g2"
t0=$(date +%s.%N)
kill -USR1 "$PID_g0"
check "G: node 0 prints a diagnosis without nodes 1 and 2" wait_for_text "$TMP/g0.err" \
    "(asked for with SIGUSR1 on node 0) without node 1, 2:" 40
t1=$(date +%s.%N)
print_diagnosis "$TMP/g0.err"
wait_s=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
check "G: ... after one deadline for both nodes (${wait_s} s; 10 s each was 20 s)" \
    python3 -c "import sys; sys.exit(not 9 <= $wait_s < 16)"
kill -CONT "$PID_g1" "$PID_g2"
check "G: a node that answered late says so" wait_for_text "$TMP/g1.err" \
    "mtrun: node 0 stopped waiting for this node's flight recorder summary (mtrun/diag/u1/1)" 15
check "G: ... both" wait_for_text "$TMP/g2.err" "node 0 stopped waiting" 15
touch "$TMP/g_look"
check "G: no key left in the store" wait_for_text "$TMP/g0.out" "[rank0]:keys: all gone" 30
grep "keys:" "$TMP/g0.out"
kill -TERM "$PID_g0" "$PID_g1" "$PID_g2"
wait_rc "$PID_g0" 30
wait_rc "$PID_g1" 30
wait_rc "$PID_g2" 30

# H
port=$(free_port)
MT_TIMEOUT_S=30 start_node h0 0 "$port" "$LOOP" loop 10 10 "$MARKER"
sleep 2
kill -USR1 "$PID_h0"
check "H: SIGUSR1 while joining says there is no diagnosis" wait_for_text "$TMP/h0.err" \
    "mtrun: received SIGUSR1 while no ranks run (joining the job or between rounds): no diagnosis" 10
kill -TERM "$PID_h0"
wait_rc "$PID_h0" 30

check "no leftovers" no_leftovers 15
if [ "$FAILURES" != 0 ]; then
    for name in stop mm ok e0 e1 f0 f1 g0 g1 g2 h0; do show "$name"; done
fi
finish
