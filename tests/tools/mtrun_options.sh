#!/usr/bin/env bash
# mtrun test 8: option spellings, bad values (exit 2 with one clear line), --help, `--`, and
# programs that cannot be executed.
. "$(dirname "$0")/mtrun_lib.sh"

# bad ARGS... EXPECTED-TEXT: mtrun exits 2 with one line on stderr containing the text
bad() {
    local expect=${*: -1}
    local args=("${@:1:$#-1}")
    "$MTRUN" "${args[@]}" >"$TMP/bad.out" 2>"$TMP/bad.err"
    local rc=$?
    check "mtrun ${args[*]}: exit 2 (got $rc)" test "$rc" = 2
    check "mtrun ${args[*]}: one line" test "$(wc -l <"$TMP/bad.err")" = 1
    check "mtrun ${args[*]}: says '$expect'" grep -qF -- "mtrun: $expect" "$TMP/bad.err"
}

bad --nnodes abc "$WORKER" "invalid value 'abc' for --nnodes"
bad --nnodes=0 "$WORKER" "invalid value '0' for --nnodes"
bad --nproc_per_node -2 "$WORKER" "invalid value '-2' for --nproc_per_node"
bad --nproc-per-node=2x "$WORKER" "invalid value '2x' for --nproc_per_node"
bad --node_rank 2 --nnodes 2 "$WORKER" "--node_rank 2 is out of range: it must be below --nnodes 2"
bad --node-rank=-1 "$WORKER" "invalid value '-1' for --node_rank"
bad --master_port 70000 "$WORKER" "invalid value '70000' for --master_port"
bad --master-port "$WORKER" "invalid value '$WORKER' for --master_port"
bad --nnodes "option --nnodes needs a value"
bad --standalone --nnodes 2 "$WORKER" "--standalone runs a single node"
bad --bogus "$WORKER" "unknown option '--bogus'"
# Numbers from the environment: refused with the variable, its value and the range, no rank
# started (issue 18)
MT_TIMEOUT_S=-5 bad --standalone "$WORKER" "MT_TIMEOUT_S=-5 is not a number of seconds in 0.001..1e+08"
MT_TIMEOUT_S=5x bad --standalone "$WORKER" "MT_TIMEOUT_S=5x is not a number of seconds"
MT_KILL_GRACE_S=1e9 bad --standalone "$WORKER" "MT_KILL_GRACE_S=1e9 is not a number of seconds in 0..3600 (seconds between SIGTERM and SIGKILL)"
# torchrun's rendezvous and supervision options (issue 15)
bad --nnodes 1:4 "$WORKER" "--nnodes 1:4 asks for elastic membership (between 1 and 4 nodes), which mtrun does not support"
bad --nnodes=3:2 "$WORKER" "invalid value '3:2' for --nnodes"
bad --nnodes 2: "$WORKER" "invalid value '2:' for --nnodes"
bad --max_restarts=-1 "$WORKER" "invalid value '-1' for --max_restarts"
bad --rdzv-backend etcd "$WORKER" "invalid value 'etcd' for --rdzv_backend"
bad --rdzv-conf foo=1 "$WORKER" "unknown --rdzv_conf key 'foo' (known: join_timeout, last_call_timeout, is_host, token_file)"
bad --rdzv-conf join_timeout=1,bar=2 "$WORKER" "unknown --rdzv_conf key 'bar'"
bad --rdzv-conf join_timeout=abc "$WORKER" "invalid value 'abc' for --rdzv_conf join_timeout"
bad --rdzv-conf join_timeout "$WORKER" "invalid --rdzv_conf item 'join_timeout': expected key=value"
bad --rdzv-conf is_host=maybe --rdzv-backend c10d "$WORKER" "invalid value 'maybe' for --rdzv_conf is_host"
bad --rdzv-conf is_host=true "$WORKER" "--rdzv_conf is_host applies to --rdzv_backend c10d"
bad --rdzv-endpoint host:99999 "$WORKER" "invalid value 'host:99999' for --rdzv_endpoint"
bad --rdzv-endpoint :1234 "$WORKER" "invalid value ':1234' for --rdzv_endpoint"
bad --rdzv-endpoint 127.0.0.1:1234 --master-port 1 "$WORKER" "--rdzv_endpoint and --master_addr/--master_port both give the store's address"
bad --standalone --rdzv-endpoint 127.0.0.1 "$WORKER" "--standalone hosts the store on a free local port"
bad --rdzv-backend c10d --nnodes 2 --node-rank 1 "$WORKER" "--rdzv_backend c10d assigns node ranks in the order nodes join; leave out --node_rank 1"
bad --rdzv-backend static --nnodes 2 "$WORKER" "--rdzv_backend static needs --node_rank on each of the 2 nodes"
bad --monitor-interval 0 "$WORKER" "invalid value '0' for --monitor_interval"
bad --role= "$WORKER" "invalid value '' for --role"
bad "missing PROGRAM to run"
bad --nnodes 1 -- "missing PROGRAM to run"

"$MTRUN" --help >"$TMP/help.out" 2>&1
check "--help exits 0 (got $?)" test $? = 0
check "--help shows usage" grep -q "^usage: mtrun \[options\] PROGRAM" "$TMP/help.out"
"$MTRUN" -h >/dev/null 2>&1
check "-h exits 0" test $? = 0

# Both spellings and --opt=value reach the ranks; options stop at the program (whose own
# options are left alone) or at `--`.
start_bg spell "$MTRUN" --nproc-per-node=2 --rdzv-id=spelled --master-addr=127.0.0.1 --standalone \
    --log-dir="$TMP/logs" -- "$WORKER" --env --marker "$MARKER"
wait_rc "$PID_spell" 20
check "dash spellings: exit 0 (got $RC)" test "$RC" = 0
check "dash spellings: two ranks" has_line "$TMP/spell.out" "[rank1]:env WORLD_SIZE=2"
check "dash spellings: job id" has_line "$TMP/spell.out" "[rank1]:env MT_RDZV_ID=spelled"
check "dash spellings: log dir created" bash -c "test -s '$TMP'/logs/spelled_??????/attempt_0/1/stdout.log"

# Accepted with torchrun's meaning: N:N, no restarts, a role, a monitor interval, last_call_timeout.
start_bg torchrun_opts "$MTRUN" --standalone --nnodes 1:1 --max-restarts 0 --monitor-interval 0.5 \
    --role trainer --rdzv-conf last_call_timeout=2 "$WORKER" --env --marker "$MARKER"
wait_rc "$PID_torchrun_opts" 20
check "torchrun options: exit 0 (got $RC)" test "$RC" = 0
check "torchrun options: role name" has_line "$TMP/torchrun_opts.out" "[rank0]:env ROLE_NAME=trainer"
check "torchrun options: no restarts" has_line "$TMP/torchrun_opts.out" "[rank0]:env TORCHELASTIC_MAX_RESTARTS=0"
start_bg default_role "$MTRUN" --standalone "$WORKER" --env --marker "$MARKER"
wait_rc "$PID_default_role" 20
check "default role: exit 0 (got $RC)" test "$RC" = 0
check "default role: ROLE_NAME=default" has_line "$TMP/default_role.out" "[rank0]:env ROLE_NAME=default"

start_bg prog_opts "$MTRUN" --standalone "$WORKER" --nnodes 5 --marker "$MARKER"
wait_rc "$PID_prog_opts" 20
check "the program's own options are passed on (worker rejects --nnodes: exit 64, got $RC)" test "$RC" = 64
check "the worker saw --nnodes" grep -qF "[rank0]:prog_mtrun_worker: unknown argument --nnodes" "$TMP/prog_opts.err"

# Programs that cannot run: a clear error naming them, non-zero exit.
"$MTRUN" --standalone --nproc_per_node 2 no_such_program_$$ >"$TMP/nf.out" 2>"$TMP/nf.err"
rc=$?
check "missing program: exit 127 (got $rc)" test "$rc" = 127
check "missing program: named" grep -qF "mtrun: cannot execute 'no_such_program_$$' on node 0: not found in PATH" "$TMP/nf.err"
printf 'not a program\n' >"$TMP/notexec"
chmod 644 "$TMP/notexec"
"$MTRUN" --standalone "$TMP/notexec" >"$TMP/ne.out" 2>"$TMP/ne.err"
rc=$?
check "non-executable program: exit 126 (got $rc)" test "$rc" = 126
check "non-executable program: named" grep -qF "mtrun: cannot execute '$TMP/notexec' on node 0: Permission denied" "$TMP/ne.err"
"$MTRUN" --standalone "$TMP" >"$TMP/dir.out" 2>"$TMP/dir.err"
rc=$?
check "a directory: exit 126 (got $rc)" test "$rc" = 126
check "a directory: named" grep -qF "mtrun: cannot execute '$TMP' on node 0: Is a directory" "$TMP/dir.err"
check "--log_dir that is a file: exit non-zero" bash -c "! '$MTRUN' --standalone --log_dir '$TMP/notexec' '$WORKER' 2>/dev/null"

# A program that cannot start on one node of two stops the other node too.
port=$(free_port)
args=(--nnodes 2 --master_port "$port" --rdzv_id nf_$$)
start_bg nf0 "$MTRUN" "${args[@]}" --node_rank 0 "$WORKER" --sleep 60 --marker "$MARKER"
start_bg nf1 "$MTRUN" "${args[@]}" --node_rank 1 no_such_program_$$ --marker "$MARKER"
wait_rc "$PID_nf1" 20
rc1=$RC
wait_rc "$PID_nf0" 20
check "missing program on node 1: node 1 exits 127 (got $rc1)" test "$rc1" = 127
check "missing program on node 1: node 0 exits 127 (got $RC)" test "$RC" = 127
check "missing program on node 1: node 0 names it" has_line "$TMP/nf0.err" \
    "mtrun: cannot execute 'no_such_program_$$' on node 1: not found in PATH; stopping the job"
check "no leftovers" no_leftovers 10
finish
