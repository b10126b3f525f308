#!/usr/bin/env bash
# A deferred GPT on 8 ranks (dp 8) under a device cap (prog_gpt_deferred_mem.c says what each
# mode checks): construction and sharding under a third of the whole f32 model, where eager
# creation fails; 3 training steps under 70% of it (sharded f32 training needs 16 bytes per
# parameter / dp = 2 bytes per parameter, half the model, plus one unit gathered at a time).
# usage: gpt_deferred_mem.sh MTRUN PROG
set -u
MTRUN=$1
PROG=$2
export MT_DEVICE=cpu MT_TIMEOUT_S=${MT_TIMEOUT_S:-60}
M=$("$PROG" size) || { echo "FAIL: $PROG size"; exit 1; }
rc=0
run() { # run MODE CAP
    echo "== $1: MT_CPU_DEVICE_MEMORY=$2 (model $M bytes)"
    if ! MT_CPU_DEVICE_MEMORY=$2 "$MTRUN" --standalone --nproc_per_node 8 "$PROG" "$1"; then
        echo "FAIL: $1 under a cap of $2 bytes"
        rc=1
    fi
}
run construct $((M / 3))
run eager $((M / 3))
run train $((M * 7 / 10))
[ $rc -eq 0 ] && echo "ok: gpt_deferred_mem"
exit $rc
