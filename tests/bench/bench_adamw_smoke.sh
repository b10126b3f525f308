#!/usr/bin/env bash
# mt-bench-adamw on a small array, so that it cannot rot: it runs to the end, prints the bound
# and one line per path this CPU has on each thread count asked for, each path's fraction of the
# bound is a positive number, and bad options exit 2. Rates are not checked (docs/benchmarks.md
# has them).
BENCH=$1
TMP_PREFIX=bench_adamw
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/bench_lib.sh"

"$BENCH" --params 100003 --rounds 2 --threads 1,3 >"$TMP/out" 2>"$TMP/err" ||
    { fail "bench exited $?"; cat "$TMP/err"; }
for t in 1 3; do
    check "threads $t: the bound" grep -q "^threads $t .*bound (4 reads, 3 writes)" "$TMP/out"
    check "threads $t: the scalar path" grep -q "^threads $t .*adamw scalar .*% of the bound" \
        "$TMP/out"
done
if grep -qw avx2 /proc/cpuinfo; then
    check "the avx2 path" grep -q "adamw avx2 .*% of the bound" "$TMP/out"
fi
bad_fraction=$(sed -n 's/.* \([0-9.]*\)% of the bound/\1/p' "$TMP/out" |
    awk '$1 <= 0 { n++ } END { print n + 0 }')
check "every fraction of the bound is positive" test "$bad_fraction" = 0
refuses_options "$BENCH" mt-bench-adamw "--params 0" "--rounds x" "--threads 0" "--threads 1,,x" \
    "--isa sse9" "--bogus 1" "--params"
finish
