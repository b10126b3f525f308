#!/usr/bin/env bash
# MT_TOPO_FILE: mtrun plans the binding for the machine the file describes, reports it and
# leaves this machine's affinity alone; the runtime's topology is the file's; bad files are one
# clear error. Expected cpus are read off the NDv2 file: <cpu numaid="0" affinity="...000fffff">
# (cpus 0-19) holds GPUs 0-3, numaid 1 (cpus 20-39) GPUs 4-7.
. "$(dirname "$0")/mtrun_bind_lib.sh"

FILE="$FIXTURES/nccl-azure-ndv2-v100x8-topo.xml"
INHERITED=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)

# The default is numa (the file has GPUs): each rank would go to its GPU's node.
MT_TOPO_FILE=$FILE run numa "$MTRUN" --standalone --nproc_per_node 8 "$PROG"
ran_ok numa
for r in 0 1 2 3 4 5 6 7; do
    if [ $r -lt 4 ]; then node=0 cpus=0-19; else node=1 cpus=20-39; fi
    check "file numa: rank $r's line" test "$(bind_line numa $r)" = \
        "would bind to NUMA node $node (cpus $cpus, nearest GPU $r) (MT_TOPO_FILE=$FILE: not applied)"
    check "file numa: rank $r's affinity is unchanged ($INHERITED)" test "$(field numa $r affinity)" = "$INHERITED"
done

# core: the file has no cores, so each node's cpu list is split, and the line says so.
MT_TOPO_FILE=$FILE run core "$MTRUN" --standalone --nproc_per_node 8 --bind core "$PROG"
ran_ok core
want=(0-4 5-9 10-14 15-19 20-24 25-29 30-34 35-39)
for r in 0 1 2 3 4 5 6 7; do
    line=$(bind_line core $r)
    check "file core: rank $r would get cpus ${want[$r]}" test "$(line_cpus "$line")" = "${want[$r]}"
    check "file core: rank $r's line says the list is split" grep -q "^would bind to 5 cpus of NUMA node .*no core information" <<<"$line"
    check "file core: rank $r's affinity is unchanged" test "$(field core $r affinity)" = "$INHERITED"
done

# More ranks than the file's cpus: the warning is printed, and marked as not applied.
SMALL="$FIXTURES/hwloc-nvidia-dgx2-v100-nvswitch.v2.xml"
MT_TOPO_FILE=$SMALL run small "$MTRUN" --standalone --nproc_per_node 4 --bind core "$PROG"
ran_ok small
check "file round-robin: one warning, marked not applied" test \
    "$(grep -c "^mtrun: more local ranks than cores: .*round-robin.*(MT_TOPO_FILE: not applied)$" "$TMP/small.err")" = 1
check "file round-robin: affinity unchanged" test "$(field small 3 affinity)" = "$INHERITED"

# The runtime's topology is the file's.
MT_TOPO_FILE=$FILE run init "$MTRUN" --standalone --bind none "$PROG" --init
ran_ok init
check "runtime topology from the file" test "$(field init 0 topology)" = "$FILE numa=2 gpus=8"

# MT_DEVICE_MAP picks each rank's GPU, so the binding follows the map: on the crossed-pairs
# file (GPUs 0-1 on node 0, cpus 0-15; GPUs 2-3 on node 1, cpus 16-31), 3,2,1,0 puts local
# ranks 0 and 1 on node 1. (mtrun used to bind local rank i near GPU i whatever the map said.)
CROSSED="$FIXTURES/../placement/nvlink-crossed-pairs-4gpu.xml"
MT_TOPO_FILE=$CROSSED MT_DEVICE_MAP=3,2,1,0 run map "$MTRUN" --standalone --nproc_per_node 4 "$PROG"
ran_ok map
map_gpus=(3 2 1 0)
for r in 0 1 2 3; do
    g=${map_gpus[$r]}
    if [ "$g" -lt 2 ]; then node=0 cpus=0-15; else node=1 cpus=16-31; fi
    want="would bind to NUMA node $node (cpus $cpus, nearest GPU $g)"
    check "file map: rank $r's line (GPU $g)" test "$(bind_line map $r)" = \
        "$want (MT_TOPO_FILE=$CROSSED: not applied)"
done
# A map the ranks will refuse: mtrun binds nobody (the ranks report the map themselves).
MT_TOPO_FILE=$CROSSED MT_DEVICE_MAP=0,1 run badmap "$MTRUN" --standalone --nproc_per_node 4 "$PROG"
check "file bad map: mtrun says why the ranks are not bound" grep -qF \
    "mtrun: the ranks are not bound: MT_DEVICE_MAP='0,1' has 2 entries for 4 local ranks" \
    "$TMP/badmap.err"
check "file bad map: no rank would be bound" test "$(grep -c 'would bind' "$TMP/badmap.err")" = 0

# Bad files: mtrun stops with one line naming the variable and the file, before any rank.
bad_file() {
    local name=$1 path=$2 expect=$3
    MT_TOPO_FILE=$path run "$name" "$MTRUN" --standalone "$PROG"
    check "$name: exit 2 (got $RC)" test "$RC" = 2
    check "$name: one line" test "$(wc -l <"$TMP/$name.err")" = 1
    check "$name: names MT_TOPO_FILE and the file" grep -qF "mtrun: MT_TOPO_FILE=$path cannot be used: $expect" "$TMP/$name.err"
    check "$name: no rank ran" test ! -s "$TMP/$name.out"
}
bad_file missing "$TMP/no_such.xml" "topology file $TMP/no_such.xml cannot be opened"
printf '<system version="1"><cpu numaid="0" affinity="f"' >"$TMP/cut.xml"
bad_file truncated "$TMP/cut.xml" "topology file $TMP/cut.xml"
bad_file directory "$TMP" "topology file $TMP is a directory"

# With --bind none mtrun does not need the topology; the runtime still reports the bad file
# when asked, naming it.
MT_TOPO_FILE=$TMP/no_such.xml run lazy "$MTRUN" --standalone --bind none "$PROG" --init
check "runtime with a missing file: the rank fails (exit $RC)" test "$RC" = 3
check "runtime with a missing file: the error names it" grep -qF \
    "[rank0]:topology-error rank 0: MT_TOPO_FILE=$TMP/no_such.xml cannot be used: topology file $TMP/no_such.xml cannot be opened" "$TMP/lazy.out"

finish
