#!/usr/bin/env bash
# mt-bench-offload on small sizes, so that it cannot rot: one line per size from 64 KiB to 1 MiB
# (64 KiB, 256 KiB, 1 MiB), each with positive h2d, d2h and memcpy figures over the ucx path, the
# overlap line with positive times, and bad options exit 2. Figures are not checked
# (docs/benchmarks.md has them).
BENCH=$1
TMP_PREFIX=bench_offload
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/bench_lib.sh"

"$BENCH" --min-bytes 64KiB --max-bytes 1MiB --total 8MiB --reps 1 --overlap-bytes 1MiB \
    >"$TMP/out" 2>"$TMP/err" ||
    { fail "bench exited $?"; cat "$TMP/err"; }
check "four lines" test "$(wc -l <"$TMP/out")" -eq 4
for bytes in 65536 262144 1048576; do
    check "line for $bytes bytes with positive figures over ucx" awk -v b="$bytes" '
        $1 == "bytes=" b && $5 == "path=ucx" {
            for (i = 2; i <= 4; i++) { split($i, kv, "="); if (!(kv[2] + 0 > 0)) exit 1 }
            found = 1
        }
        END { exit !found }' "$TMP/out"
done
check "overlap line with positive times" awk '
    $1 == "overlap" && $2 == "bytes=1048576" {
        for (i = 3; i <= 5; i++) { split($i, kv, "="); if (!(kv[2] + 0 > 0)) exit 1 }
        found = 1
    }
    END { exit !found }' "$TMP/out"
refuses_options "$BENCH" mt-bench-offload "--reps 0" "--min-bytes x" "--bogus 1" "--total" \
    "--min-bytes 2MiB --max-bytes 1MiB" "--overlap-bytes x"
finish
