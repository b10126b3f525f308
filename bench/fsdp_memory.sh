#!/usr/bin/env bash
# Per-rank peak model state of FSDP training for N = 1, 2, 4, 8 ranks, one table:
#   bench/fsdp_memory.sh BUILD_DIR [mt-bench-fsdp-memory options...]
# Exits non-zero when a run fails or a ratio measured/theory is above 1.10.
set -u
BUILD=${1:?usage: fsdp_memory.sh BUILD_DIR [options...]}
shift
header=()
status=0
for n in 1 2 4 8; do
    out=$("$BUILD/bin/mtrun" --standalone --nproc_per_node "$n" \
        "$BUILD/bin/mt-bench-fsdp-memory" "${header[@]}" "$@" 2>&1)
    rc=$?
    rows=$(printf '%s\n' "$out" | sed -n 's/^\[rank0\]://p' | grep -E '^ *(ranks|[0-9]+) ')
    if [ $rc -ne 0 ] || [ -z "$rows" ]; then
        echo "N=$n failed (exit $rc):" >&2
        printf '%s\n' "$out" >&2
        status=1
        continue
    fi
    printf '%s\n' "$rows"
    header=(--no-header)
    ratio=$(printf '%s\n' "$rows" | tail -1 | awk '{print $NF}')
    awk -v r="$ratio" 'BEGIN { exit !(r > 1.10) }' && { echo "N=$n: ratio $ratio above 1.10" >&2; status=1; }
done
exit $status
