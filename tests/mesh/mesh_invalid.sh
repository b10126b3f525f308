#!/usr/bin/env bash
# Invalid meshes as a user meets them: mtrun runs test_mesh with a bad spec; the job must exit
# non-zero within seconds (MT_TIMEOUT_S is 30, so a hang would show) with the message on stderr.
# usage: mesh_invalid.sh MTRUN TEST_MESH
set -u
mtrun=$1
prog=$2
export MT_TIMEOUT_S=30 MT_DEVICE=cpu
failures=0

# case NAME MESSAGE ARGS...: 4 ranks run test_mesh ARGS
case_() {
    local name=$1 message=$2
    shift 2
    local out start end rc
    start=$(date +%s.%N)
    out=$("$mtrun" --standalone --nproc_per_node 4 "$prog" "$@" 2>&1)
    rc=$?
    end=$(date +%s.%N)
    local secs
    secs=$(python3 -c "print(f'{$end - $start:.1f}')")
    if [ "$rc" -ne 0 ] && grep -qF -- "$message" <<<"$out" && python3 -c "import sys; sys.exit(0 if $secs < 15 else 1)"; then
        echo "ok: $name: exit $rc after ${secs}s: $(grep -F -- "$message" <<<"$out" | head -n 1)"
    else
        echo "FAIL: $name: exit $rc after ${secs}s, wanted non-zero within 15 s and '$message'; output:" >&2
        echo "$out" | tail -n 20 >&2
        failures=$((failures + 1))
    fi
}

case_ product "dp 3 x tp 2 = 6 != world size 4" --shape 3x2 --names dp,tp
case_ duplicate "dimension name 'tp' appears twice" --shape 2x2 --names tp,tp
case_ empty "dimension 1 has an empty name" --shape 2x2 --names dp,EMPTY
case_ zero "dimension 0 ('dp') has size 0; sizes must be positive" --shape 0x4 --names dp,tp
case_ negative "has size -2; sizes must be positive" --shape -2x-2 --names dp,tp
case_ too_long "is longer than 31 characters" --shape 4 --names dddddddddddddddddddddddddddddddddddd
case_ disagree "the ranks disagree: ranks 0-2 passed shape 2x2 names 'dp','tp'; rank 3 passed shape 4x1 names 'dp','tp'" \
    --shape 2x2 --names dp,tp --last-rank-shape 4x1
crossed=$(dirname "$0")/../fixtures/placement/nvlink-crossed-pairs-4gpu.xml
MT_TOPO_FILE=$crossed MT_DEVICE_MAP=0,1 case_ device_map_short \
    "MT_DEVICE_MAP='0,1' has 2 entries for 4 local ranks" --shape 2x2 --names dp,tp
MT_TOPO_FILE=$crossed MT_DEVICE_MAP=0,1,2,9 case_ device_map_range \
    "MT_DEVICE_MAP='0,1,2,9': entry 3 is not a GPU index between 0 and 3" --shape 2x2 --names dp,tp
MT_TOPO_FILE=/nonexistent/topo.xml case_ topo_file_missing "/nonexistent/topo.xml" \
    --shape 2x2 --names dp,tp
exit $((failures > 0))
