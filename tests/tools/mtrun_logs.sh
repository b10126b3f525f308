#!/usr/bin/env bash
# mtrun test: --log_dir files in torchrun's layout (ID_XXXXXX/attempt_0/LOCAL_RANK/stdout.log,
# stderr.log), --redirects and --tee (which streams of which local ranks reach the console), a
# temporary directory when --log_dir is missing, and bad values.
. "$(dirname "$0")/mtrun_lib.sh"

# run NAME ARGS...: a 2-rank job of workers printing "env RANK=R" on stdout and "to-stderr
# rank=R" on stderr; sets LOGS to the attempt directory mtrun names on stderr
run() {
    local name=$1
    shift
    TMPDIR="$TMP" start_bg "$name" "$MTRUN" --standalone --nproc_per_node 2 --rdzv_id "$name" "$@" \
        "$WORKER" --env --marker "$MARKER"
    expect_rc "$name" 0 20
    LOGS=$(sed -n 's|^mtrun: .*log files of the ranks: \(.*\)/attempt_0/LOCAL_RANK/.*|\1/attempt_0|p' \
        "$TMP/$name.err")
    check "$name: log directory named" test -n "$LOGS"
}

# files NAME: every stream of both ranks is in its file, unprefixed, whatever the console got
files() {
    for r in 0 1; do
        check "$1: rank $r stdout.log" has_line "$LOGS/$r/stdout.log" "env RANK=$r"
        check "$1: rank $r stderr.log" has_line "$LOGS/$r/stderr.log" "to-stderr rank=$r"
        check "$1: rank $r stdout.log has no stderr" bash -c "! grep -q to-stderr '$LOGS/$r/stdout.log'"
        check "$1: rank $r files unprefixed" bash -c "! grep -qF '[rank' '$LOGS/$r/stdout.log' '$LOGS/$r/stderr.log'"
    done
}

# console NAME RANK out|err yes|no: whether the rank's stream reached mtrun's stdout/stderr
console() {
    local line="[rank$2]:env RANK=$2" file="$TMP/$1.out"
    [ "$3" = err ] && line="[rank$2]:to-stderr rank=$2" file="$TMP/$1.err"
    if [ "$4" = yes ]; then
        check "$1: rank $2 $3 on the console" has_line "$file" "$line"
    else
        # stdout: no line of the rank at all; stderr also has mtrun's "[rankN]: not bound" line
        local pattern="^\[rank$2\]:"
        [ "$3" = err ] && pattern="^\[rank$2\]:to-stderr"
        check "$1: rank $2 $3 not on the console" bash -c "! grep -q '$pattern' '$file'"
    fi
}

# --log_dir alone: files for every stream, the console as without it.
run plain --log_dir "$TMP/logs"
check "plain: under --log_dir, named after the job id" bash -c "[[ '$LOGS' == '$TMP/logs/plain_'??????/attempt_0 ]]"
files plain
for r in 0 1; do console plain $r out yes; console plain $r err yes; done

# --redirects 3: both streams of every rank in the files only.
run redirect_all --log_dir "$TMP/logs" --redirects 3
files redirect_all
for r in 0 1; do console redirect_all $r out no; console redirect_all $r err no; done
check "redirect_all: nothing of the ranks on stdout" test ! -s "$TMP/redirect_all.out"

# Per local rank: rank 0's stdout and rank 1's stderr are redirected.
run redirect_map --log-dir="$TMP/logs" --redirects=0:1,1:2
files redirect_map
console redirect_map 0 out no
console redirect_map 0 err yes
console redirect_map 1 out yes
console redirect_map 1 err no

# --tee 1 without --log_dir: a new temporary directory (said on stderr), the console unchanged.
run tee_tmp --tee 1
check "tee_tmp: temporary directory said" grep -qF "mtrun: no --log_dir given, log files of the ranks: $TMP/mtrun_" "$TMP/tee_tmp.err"
check "tee_tmp: under TMPDIR" bash -c "[[ '$LOGS' == '$TMP/mtrun_'??????/tee_tmp_??????/attempt_0 ]]"
files tee_tmp
for r in 0 1; do console tee_tmp $r out yes; console tee_tmp $r err yes; done

# --tee wins over --redirects for the streams it names.
run tee_over --redirects 3 --tee 0:2
files tee_over
console tee_over 0 out no
console tee_over 0 err yes
console tee_over 1 out no
console tee_over 1 err no

# The same job id twice in one --log_dir: the first run's files are kept.
first=$(sed -n 's|^mtrun: log files of the ranks: \(.*\)/attempt_0/.*|\1|p' "$TMP/plain.err")
run plain_again --log_dir "$TMP/logs" --rdzv_id plain
check "same job id: a second directory" test "$(ls -d "$TMP"/logs/plain_* | wc -l)" = 2
check "same job id: first run's files kept" has_line "$first/attempt_0/1/stdout.log" "env RANK=1"

# Log files are private (0600), and a symbolic link planted at a log file's path (here: the next
# attempt's, made while the first runs) is refused with a clear error, its target untouched.
check "log files are mode 0600" test "$(stat -c %a "$first/attempt_0/0/stdout.log")" = 600
check "stderr log files are mode 0600" test "$(stat -c %a "$first/attempt_0/1/stderr.log")" = 600
echo "precious" >"$TMP/target"
TMPDIR="$TMP" start_bg planted "$MTRUN" --standalone --max_restarts 1 --log_dir "$TMP/planted" \
    --rdzv_id planted "$WORKER" --fail 0:3:1500 --marker "$MARKER"
check "planted: log directory named" wait_for_text "$TMP/planted.err" "log files of the ranks:" 10
job_dir=$(sed -n 's|^mtrun: log files of the ranks: \(.*\)/attempt_0/.*|\1|p' "$TMP/planted.err")
mkdir -p "$job_dir/attempt_1/0" && ln -s "$TMP/target" "$job_dir/attempt_1/0/stdout.log"
expect_rc planted nonzero 20
expect_text planted err "mtrun: cannot open the log file $job_dir/attempt_1/0/stdout.log of rank 0: it is a symbolic link, and mtrun never writes a log file through one; stopping the job"
check "planted: the link's target is untouched" has_line "$TMP/target" "precious"
check "planted: the target got nothing else" test "$(wc -l <"$TMP/target")" = 1

# Bad values: exit 2 with one line naming the value.
bad() {
    local expect=${*: -1}
    local args=("${@:1:$#-1}")
    "$MTRUN" "${args[@]}" "$WORKER" >"$TMP/bad.out" 2>"$TMP/bad.err"
    local rc=$?
    check "mtrun ${args[*]}: exit 2 (got $rc)" test "$rc" = 2
    check "mtrun ${args[*]}: one line" test "$(wc -l <"$TMP/bad.err")" = 1
    check "mtrun ${args[*]}: says '$expect'" grep -qF -- "mtrun: $expect" "$TMP/bad.err"
}
bad --log_dir "$TMP/bad_logs" --redirects 4 "invalid value '4' for --redirects: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"
bad --tee 0:9 "invalid value '0:9' for --tee: item '0:9' is not LOCAL_RANK:N"
bad --redirects= "invalid value '' for --redirects"
bad --redirects 1:3 "invalid value '1:3' for --redirects: local rank 1 does not exist with --nproc_per_node 1 (local ranks 0..0)"
bad --nproc_per_node 2 --tee 0:1,2:1 "invalid value '0:1,2:1' for --tee: local rank 2 does not exist with --nproc_per_node 2"
bad --nproc_per_node 2 --tee 0:1,0:2 "invalid value '0:1,0:2' for --tee: local rank 0 is given twice"
bad --tee 0:1, "invalid value '0:1,' for --tee: item '' is not LOCAL_RANK:N"
bad --redirects -1:1 "invalid value '-1:1' for --redirects: item '-1:1' is not LOCAL_RANK:N"
check "bad values: no log directory made" test ! -e "$TMP/bad_logs"
check "no leftovers" no_leftovers 5
finish
