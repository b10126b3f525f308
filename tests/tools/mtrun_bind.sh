#!/usr/bin/env bash
# mtrun --bind on this machine, for real: each rank reports its affinity (sched_getaffinity and
# Cpus_allowed_list) and memory policy; the machine's cores and NUMA nodes are read from hwloc,
# never assumed.
. "$(dirname "$0")/mtrun_bind_lib.sh"

"$PROG" --machine >"$TMP/machine" || { fail "cannot read the machine"; finish; }
NCORES=$(sed -n 's/^cores //p' "$TMP/machine")
mapfile -t CORE_CPUS < <(sed -n 's/^core [0-9]* //p' "$TMP/machine")
INHERITED=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
echo "machine: $NCORES core(s), cpus $INHERITED; $(grep -c '^numa' "$TMP/machine") NUMA node(s)"
[ "$NCORES" -ge 1 ] || { fail "no core found"; finish; }

# --bind core with as many ranks as cores: each rank gets exactly one whole core, all disjoint.
run core "$MTRUN" --standalone --nproc_per_node "$NCORES" --bind core "$PROG"
ran_ok core
: >"$TMP/seen"
for ((r = 0; r < NCORES; r++)); do
    aff=$(field core $r affinity)
    line=$(bind_line core $r)
    check "core: rank $r's line says 1 core ('$line')" grep -q "^bound to 1 core of NUMA node [0-9]* (cpus $aff)" <<<"$line"
    check "core: rank $r's status agrees ($aff)" test "$(field core $r status)" = "$aff"
    is_core=no
    for c in "${CORE_CPUS[@]}"; do [ "$c" = "$aff" ] && is_core=yes; done
    check "core: rank $r runs on one whole core (cpus '$aff')" test $is_core = yes
    check "core: rank $r has its core alone (MT_CPU_SHARERS 1)" test "$(field core $r sharers)" = 1
    expand "$aff" >>"$TMP/seen"
done
check "core: the ranks' cores are disjoint" test "$(sort "$TMP/seen" | uniq -d | wc -l)" = 0
check "core: together they cover every core" test "$(sort -u "$TMP/seen" | wc -l)" = \
    "$(for c in "${CORE_CPUS[@]}"; do expand "$c"; done | sort -u | wc -l)"
check "core: no round-robin warning" bash -c "! grep -q 'round-robin' '$TMP/core.err'"

# One rank more than cores: cores are shared round-robin, with one warning.
N=$((NCORES + 1))
run over "$MTRUN" --standalone --nproc_per_node "$N" --bind core "$PROG"
ran_ok over
check "over: one warning" test "$(grep -c '^mtrun: more local ranks than cores: ' "$TMP/over.err")" = 1
check "over: the warning counts the ranks" grep -q "^mtrun: more local ranks than cores: $N local ranks share the" "$TMP/over.err"
check "over: rank $NCORES shares rank 0's core" test "$(field over $NCORES affinity)" = "$(field over 0 affinity)"
check "over: rank $NCORES's line says shared" grep -q "shared round-robin" <<<"$(bind_line over $NCORES)"
check "over: rank $NCORES runs on one core" test -n "$(field over $NCORES affinity)"
check "over: rank 0 is told it shares its core (MT_CPU_SHARERS 2)" test "$(field over 0 sharers)" = 2
check "over: rank $NCORES too" test "$(field over $NCORES sharers)" = 2

# --bind numa: every rank runs on its NUMA node's cpus; memory is bound there too unless the
# system refuses (then mtrun says so).
run numa "$MTRUN" --standalone --nproc_per_node 2 --bind numa "$PROG"
ran_ok numa
for r in 0 1; do
    line=$(bind_line numa $r)
    node=$(sed -n 's/^bound to NUMA node \([0-9]*\) .*/\1/p' <<<"$line")
    check "numa: rank $r's line names a node ('$line')" test -n "$node"
    want=$(sed -n "s/^numa $node //p" "$TMP/machine")
    check "numa: rank $r runs on node $node's cpus ($want)" test "$(field numa $r affinity)" = "$want"
    check "numa: rank $r's line lists them" test "$(line_cpus "$line")" = "$want"
    other=$(field numa $((1 - r)) affinity)
    sharers=1
    [ "$other" = "$want" ] && sharers=2
    check "numa: rank $r is told $sharers rank(s) run on its node's cpus" \
        test "$(field numa $r sharers)" = "$sharers"
    if grep -q "cannot bind the ranks' memory" "$TMP/numa.err"; then
        check "numa: rank $r's line says memory is not bound" grep -q "memory not bound" <<<"$line"
    else
        pol=$(field numa $r mempolicy)
        check "numa: rank $r's memory is bound to node $node (policy '$pol')" \
            bash -c "[[ '$pol' =~ ^[1-9][0-9]*\ $node\$ ]]"
    fi
done

# --bind none: the inherited affinity is left alone, under a restriction too.
FIRST=$(expand "${CORE_CPUS[0]}" | head -1)
run none taskset -c "$FIRST" "$MTRUN" --standalone --nproc_per_node 2 --bind none "$PROG"
ran_ok none
for r in 0 1; do
    check "none: rank $r keeps the inherited cpu $FIRST" test "$(field none $r affinity)" = "$FIRST"
    check "none: rank $r gets no MT_CPU_SHARERS (LOCAL_WORLD_SIZE sizes its pool)" \
        test "$(field none $r sharers)" = unset
    # Said once, by the node's first rank, since every rank would say the same.
    want="not bound (--bind none)"
    [ "$r" = 0 ] || want=""
    check "none: rank $r's line ('$want')" test "$(bind_line none $r)" = "$want"
    pol=$(field none $r mempolicy)
    check "none: rank $r's memory policy is the default ('$pol'; ? when unreadable)" \
        bash -c "[ '$pol' = '0 ' ] || [ '$pol' = '?' ]"
done
run none_free "$MTRUN" --standalone --bind none "$PROG"
check "none: unrestricted, rank 0 keeps cpus $INHERITED" test "$(field none_free 0 affinity)" = "$INHERITED"

# A restricted mtrun binds only within what it may use: both ranks land on the one allowed cpu.
run core_restricted taskset -c "$FIRST" "$MTRUN" --standalone --nproc_per_node 2 --bind core "$PROG"
ran_ok core_restricted
for r in 0 1; do
    check "restricted: rank $r on cpu $FIRST" test "$(field core_restricted $r affinity)" = "$FIRST"
done

# The default: numa with GPUs, none without; MT_BIND sets it, --bind wins over MT_BIND.
run default "$MTRUN" --standalone "$PROG"
ran_ok default
line=$(bind_line default 0)
check "default: '$line'" bash -c "[ '$line' = 'not bound (--bind none, the default without GPUs)' ] || [[ '$line' == 'bound to NUMA node '* ]]"
MT_BIND=core run env_core "$MTRUN" --standalone --nproc_per_node "$NCORES" "$PROG"
ran_ok env_core
check "MT_BIND=core binds to cores" grep -q "^bound to 1 core of" <<<"$(bind_line env_core 0)"
MT_BIND=core run env_override "$MTRUN" --standalone --bind none "$PROG"
check "--bind none wins over MT_BIND=core" test "$(bind_line env_override 0)" = "not bound (--bind none)"
MT_BIND=none run env_none "$MTRUN" --standalone "$PROG"
check "MT_BIND=none is named" test "$(bind_line env_none 0)" = "not bound (MT_BIND=none)"

# Bad values: exit 2 with one line, no rank started.
run bad_opt "$MTRUN" --standalone --bind sideways "$PROG"
check "--bind sideways: exit 2 (got $RC)" test "$RC" = 2
check "--bind sideways: one line" test "$(wc -l <"$TMP/bad_opt.err")" = 1
check "--bind sideways: says so" has_line "$TMP/bad_opt.err" "mtrun: invalid value 'sideways' for --bind: expected none, numa or core"
check "--bind sideways: no rank ran" test ! -s "$TMP/bad_opt.out"
MT_BIND=Core run bad_env "$MTRUN" --standalone "$PROG"
check "MT_BIND=Core: exit 2 (got $RC)" test "$RC" = 2
check "MT_BIND=Core: says so" has_line "$TMP/bad_env.err" "mtrun: invalid MT_BIND='Core': expected none, numa or core"
run no_value "$MTRUN" --standalone --bind
check "--bind without a value: exit 2" test "$RC" = 2

# The runtime logs where the rank really runs (mt_init, at info level).
MT_LOG_LEVEL=info run init "$MTRUN" --standalone --nproc_per_node "$NCORES" --bind core "$PROG" --init
ran_ok init
for ((r = 0; r < NCORES; r++)); do
    aff=$(field init $r affinity)
    check "init: rank $r logs its affinity ($aff)" grep -qF "[rank$r]:meshtrain[rank $r] info: local rank $r of host " "$TMP/init.err"
    check "init: rank $r's logged cpus are $aff" grep -qE "^\[rank$r\]:meshtrain\[rank $r\] info: local rank $r of host .* runs on cpus $aff \(" "$TMP/init.err"
    check "init: rank $r's thread pool has its one core" test "$(field init $r threads)" = 1
    check "init: rank $r's runtime topology is live" grep -q "^topology live numa=[1-9]" <<<"$(sed -n "s/^\[rank$r\]://p" "$TMP/init.out" | grep '^topology')"
done

# The thread pool takes its rank's share of the cpus it was bound to: one rank on a NUMA node
# has all of the node's cpus; an inherited MT_CPU_SHARERS yields to mtrun's own count.
MT_CPU_SHARERS=64 run pool "$MTRUN" --standalone --bind numa "$PROG" --init
ran_ok pool
aff=$(field pool 0 affinity)
check "pool: MT_CPU_SHARERS replaced by mtrun's 1" test "$(field pool 0 sharers)" = 1
check "pool: rank 0's pool has one thread per cpu of $aff" \
    test "$(field pool 0 threads)" = "$(expand "$aff" | wc -l)"

finish
