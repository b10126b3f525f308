#!/usr/bin/env bash
# GPT initial values: a checkpoint of a GPT initialised whole on 1 rank, loaded into deferred
# GPTs on 1 rank, dp 4 and dp 2 x tp 2, equals bit for bit the same GPTs initialised shard by
# shard (prog_gpt_init_layouts.c says what is compared), whatever a rank's thread count.
# usage: gpt_init_layouts.sh MTRUN PROG
set -u
MTRUN=$1
PROG=$2
export MT_DEVICE=cpu MT_TIMEOUT_S=${MT_TIMEOUT_S:-60}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
rc=0
run() { # run NPROC ARGS...
    local np=$1
    shift
    echo "== $np rank(s): $*"
    "$MTRUN" --standalone --nproc_per_node "$np" "$PROG" "$@" || { echo "FAIL: $np: $*"; rc=1; }
}
run 1 save "$dir/ckpt"
run 1 check "$dir/ckpt"
# Seeded values are filled in chunks on the rank's pool (module/param_init.c): the same bits
# with 1 thread and with 3 as with the 2 threads (or 1 per rank at 4 ranks) above.
MT_NUM_THREADS=1 run 1 check "$dir/ckpt"
MT_NUM_THREADS=3 run 1 check "$dir/ckpt"
run 4 check "$dir/ckpt"
run 4 check "$dir/ckpt" tp2
[ $rc -eq 0 ] && echo "ok: gpt_init_layouts"
exit $rc
