#!/bin/sh
# Runs `mt-topo --input` (text and --json) on every fixture and diffs the output against
# tests/fixtures/topologies/expected/<fixture>.txt / .json; checks each JSON report's fields
# (names and types from issue 3) with python3. Prints the diff on failure.
# usage: check_expected.sh MT_TOPO FIXTURE_DIR
set -u
bin=$1
dir=$2
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
cd "$dir" || exit 1
unset MT_TOPO_FILE
fail=0
n=0
for f in *.xml; do
    name=${f%.xml}
    n=$((n + 1))
    for kind in txt json; do
        want=expected/$name.$kind
        if [ "$kind" = json ]; then
            "$bin" --input "$f" --json >"$tmp/out" 2>"$tmp/err"
        else
            "$bin" --input "$f" >"$tmp/out" 2>"$tmp/err"
        fi
        rc=$?
        if [ $rc -ne 0 ]; then
            echo "FAIL: mt-topo --input $f ($kind) exited $rc:"
            cat "$tmp/err"
            fail=1
            continue
        fi
        if [ ! -f "$want" ]; then
            echo "FAIL: $dir/$want is missing (tests/tools/update_expected.sh writes it)"
            fail=1
        elif ! diff -u "$want" "$tmp/out"; then
            echo "FAIL: the $kind report of $f differs from $want (diff above: - expected, + got)"
            fail=1
        fi
        if [ "$kind" = json ] && ! "$here/json_report_check.sh" "$tmp/out" "$f"; then
            echo "FAIL: the JSON report of $f does not have the fields issue 3 names"
            fail=1
        fi
    done
done
if [ $n -ne 15 ]; then
    echo "FAIL: $n fixtures, expected 15"
    fail=1
fi
[ $fail -eq 0 ] && echo "mt_topo_expected: $n fixtures match their expected reports"
exit $fail
