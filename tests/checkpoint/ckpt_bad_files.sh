#!/usr/bin/env bash
# Damaged checkpoints through mtrun (prog_ckpt_bad.c says what each run checks).
# usage: ckpt_bad_files.sh MTRUN PROG VARIANT
#   dp2   saved and damaged on dp 2 (2 ranks); then loaded on 1 rank (another world size)
#   tp2   saved and damaged on tp 2 (2 ranks); then loaded on dp 2 x tp 2 (4 ranks)
# Each damaged copy (tests/checkpoint/ckpt_tool.py corrupt) must be refused on every rank with a
# message naming the file or the tensor, in time, leaving the model and optimizer as they were.
set -u
MTRUN=$1
PROG=$2
VARIANT=$3
TMP_PREFIX=ckpt_bad_files
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
TOOL=$(dirname "${BASH_SOURCE[0]}")/ckpt_tool.py
export MT_TIMEOUT_S=${MT_TIMEOUT_S:-30} MT_DEVICE=cpu

case $VARIANT in
dp2) layout=(2 1) other=(1 1 1) ;; # dp tp; then nproc dp tp of the other world size
tp2) layout=(1 2) other=(4 2 2) ;;
*)
    fail "unknown variant '$VARIANT'"
    finish
    ;;
esac

# prog NAME NPROC ARGS...: one prog_ckpt_bad job that must pass all its checks, in time
prog() {
    local name=$1 np=$2
    shift 2
    start_bg "$name" "$MTRUN" --standalone --nproc_per_node "$np" "$PROG" "$@"
    expect_rc "$name" 0 90
    grep -h '^\[rank0\]:ok: ' "$TMP/$name.out" | cut -c1-"$SHOW_WIDTH"
}

prog save 2 save "$TMP/good" "${layout[@]}"
mkdir "$TMP/bad"
check "damaged copies made" python3 "$TOOL" corrupt "$TMP/good" "$TMP/bad" "$TMP/cases.tsv"
prog check 2 check "$TMP/good" "$TMP/cases.tsv" "${layout[@]}"
prog world "${other[0]}" world "$TMP/good" "${other[1]}" "${other[2]}"
finish
