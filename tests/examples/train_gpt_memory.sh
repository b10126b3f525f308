#!/usr/bin/env bash
# train_gpt's memory prediction (mt_gpt_memory_predict, docs/train_gpt.md) against the device's
# accounting, through mtrun as a user runs it.
# usage: train_gpt_memory.sh MTRUN TRAIN_GPT VARIANT
#   matrix    every configuration of VARIANTS below: each category's predicted peak and the
#             total's against the highest measured (--metrics peak_bytes: max over ranks, over
#             steps), and the total before step 0 (setup_peak_bytes: building and sharding),
#             within 10% or 1 MiB (whichever is looser) and, for the configurations marked
#             exact, to the byte; the same for the host memory tier's peaks (host_peak_bytes
#             against predicted_host_peak_bytes: offload), which are zero without offload
#   offload   the same for OFFLOAD_VARIANTS (FSDP CPU offload)
#   capacity  MT_CPU_DEVICE_MEMORY at the predicted total: the run says it fits and completes;
#             one byte less: the run warns before step 0 and runs out of device memory
set -u
MTRUN=$1
PROG=$2
VARIANT=$3
TMP_PREFIX=train_gpt_memory
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export MT_TIMEOUT_S=${MT_TIMEOUT_S:-60} MT_DEVICE=cpu

# Large enough that every category but comm is above 1 MiB (so the 10% bound is the one that
# counts), small enough for a few seconds on 2 cores. 3 steps: step 0 runs before FSDP's order
# is recorded (no prefetch) and the transport's scratch grows in it; the later steps are the
# steady state the prediction describes.
MODEL=(--layers 3 --d-model 128 --heads 4 --seq 64 --batch 4 --steps 3 --lr 1e-3 --seed 3)

# The configurations: NAME RANKS CHECK OPTIONS... (CHECK: exact, or spec for 10% / 1 MiB alone;
# an option VAR=VALUE is put in the run's environment instead).
# A new option that changes what a step allocates comes in as spec first, then exact once the
# prediction matches to the byte.
VARIANTS=(
    "one_rank 1 exact"
    "dp2 2 exact --dp 2"
    "dp4 4 exact --dp 4"
    "tp2 2 exact --tp 2"
    "dp2_tp2 4 exact --dp 2 --tp 2"
    "bf16 2 exact --dp 2 --param-dtype bf16 --reduce-dtype bf16"
    "bf16_tp2 2 exact --tp 2 --param-dtype bf16"
    "accum2 2 exact --dp 2 --grad-accum 2 --batch 2"
    "no_prefetch 2 exact --dp 2 --no-prefetch"
    "no_reshard 2 exact --dp 2 --reshard-after-forward 0"
    "reshard_all_dp2_tp2 4 exact --dp 2 --tp 2 --reshard-after-forward 1"
    "dp2_tp2_bf16_accum 4 exact --dp 2 --tp 2 --param-dtype bf16 --reduce-dtype bf16 --grad-accum 2"
    # The transport's scratch: every collective direct (large threshold), every one a ring.
    "direct_collectives 4 exact MT_COMM_SMALL_BYTES=1000000 --dp 2 --tp 2"
    "ring_collectives 4 exact MT_COMM_SMALL_BYTES=256 --dp 2 --tp 2 --reduce-dtype bf16"
    # Activation recompute.
    "ac_full 2 exact --dp 2 --activation-checkpointing full"
    "ac_every2_tp2 4 exact --dp 2 --tp 2 --activation-checkpointing every:2"
    "ac_full_bf16_tp2 2 exact --tp 2 --param-dtype bf16 --activation-checkpointing full"
    # Sequence parallelism (re-gather), alone and with recompute.
    "sp_tp2 2 exact --tp 2 --sequence-parallel"
    "sp_dp2_tp2 4 exact --dp 2 --tp 2 --sequence-parallel"
    "sp_tp4 4 exact --tp 4 --sequence-parallel --batch 1"
    "sp_ac_dp2_tp2 4 exact --dp 2 --tp 2 --sequence-parallel --activation-checkpointing full"
    "sp_ac_bf16_tp2 2 exact --tp 2 --sequence-parallel --activation-checkpointing every:2 --param-dtype bf16"
    # Sequence parallelism keeping the column-parallel inputs gathered, alone and with recompute.
    "spk_tp2 2 exact --tp 2 --sequence-parallel=keep-gathered"
    "spk_dp2_tp2 4 exact --dp 2 --tp 2 --sequence-parallel=keep-gathered"
    "spk_tp4 4 exact --tp 4 --sequence-parallel=keep-gathered --batch 1"
    "spk_ac_dp2_tp2 4 exact --dp 2 --tp 2 --sequence-parallel=keep-gathered --activation-checkpointing full"
    "spk_ac_bf16_tp2 2 exact --tp 2 --sequence-parallel=keep-gathered --activation-checkpointing every:2 --param-dtype bf16"
    # Mapped gathers (fsdp.h mapped_gather): blocks wide enough for a shard of >= 1 MiB are
    # padded to pages and gathered without a full buffer; with the option off, copied.
    "mapped_dp2 2 exact --dp 2 --d-model 256"
    "mapped_off_dp2 2 exact --dp 2 --d-model 256 --mapped-gather 0"
    "mapped_dp4_noreshard 4 exact --dp 4 --d-model 384 --reshard-after-forward 0"
    "mapped_dp2_tp2 4 exact --dp 2 --tp 2 --d-model 512 --heads 8"
)
# Variant offload: FSDP CPU offload, the device's share and the host tier's (docs/offload.md).
# Ratio 0.5 of 4 units offloads block 1 and the root (the landing block grows from a block's
# shard to the root's); bf16 puts the master in optimizer and the bf16 shard in params.
OFFLOAD_VARIANTS=(
    "off_opt 1 exact --offload optimizer"
    "off_opt_dp2 2 exact --dp 2 --offload optimizer"
    "off_full_dp2 2 exact --dp 2 --offload full"
    "off_full_dp2_tp2 4 exact --dp 2 --tp 2 --offload full"
    "off_ratio_dp2 2 exact --dp 2 --offload full --offload-ratio 0.5"
    "off_full_ac_dp2 2 exact --dp 2 --offload full --activation-checkpointing full"
    "off_opt_bf16_dp2 2 exact --dp 2 --offload optimizer --param-dtype bf16 --reduce-dtype bf16"
    "off_full_noprefetch_dp2 2 exact --dp 2 --offload full --no-prefetch"
    "off_full_accum2_dp2 2 exact --dp 2 --offload full --grad-accum 2 --batch 2"
    "off_full_sp_bf16_dp2_tp2 4 exact --dp 2 --tp 2 --offload full --sequence-parallel --param-dtype bf16 --reduce-dtype bf16"
    "off_opt_ratio_tp2 2 exact --tp 2 --offload optimizer --offload-ratio 0.3"
)

# run NAME RANKS [VAR=VALUE...] OPTIONS...: one mtrun; metrics in $TMP/NAME.jsonl, output in
# $TMP/NAME.out/.err
run() {
    local name=$1 np=$2 vars=() opts=()
    shift 2
    for a in "$@"; do
        if [[ $a =~ ^[A-Z_]+= ]]; then vars+=("$a"); else opts+=("$a"); fi
    done
    env "${vars[@]}" timeout 200 "$MTRUN" --standalone --nproc_per_node "$np" "$PROG" \
        "${MODEL[@]}" --metrics "$TMP/$name.jsonl" "${opts[@]}" >"$TMP/$name.out" \
        2>"$TMP/$name.err"
}

# compare NAME CHECK: the predictions against the measured peaks; prints the table.
compare() {
    python3 - "$TMP/$1.jsonl" "$2" <<'EOF'
import json, sys
path, check = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(path) if l.strip()]
rows = [r for r in rows if "peak_bytes" in r]
if len(rows) < 2:
    sys.exit("%d step lines in %s: need 2 or more" % (len(rows), path))
pred = rows[0]["predicted_peak_bytes"]
bad = []
for k in ["params", "grads", "optimizer", "activations", "comm", "total"]:
    p = pred[k]
    m = max(r["peak_bytes"][k] for r in rows)
    if any(r["predicted_peak_bytes"][k] != p for r in rows):
        bad.append("%s: the prediction changes between steps" % k)
    slack = max(0.10 * m, 1 << 20)
    ok = abs(p - m) <= slack and (check != "exact" or p == m) and (p > 0) == (m > 0)
    print("  %-12s predicted %10d measured %10d ratio %.4f %s" %
          (k, p, m, m / p if p else float("nan"), "" if ok else "<-- off"))
    if not ok:
        bad.append(k)
setup = rows[0]["setup_peak_bytes"]
p, m = setup["predicted"], setup["measured"]
ok = abs(p - m) <= max(0.10 * m, 1 << 20) and (check != "exact" or p == m) and (p > 0) == (m > 0)
print("  %-12s predicted %10d measured %10d ratio %.4f %s" %
      ("setup total", p, m, m / p if p else float("nan"), "" if ok else "<-- off"))
if not ok:
    bad.append("setup total")
# A category may be zero on either side (full offload: the device has no optimizer state, and
# deferred initialisation no setup peak on the device), but on both sides or neither.
# The host memory tier: zero without offload, the offloaded state and landing block with it.
hpred = rows[0]["predicted_host_peak_bytes"]
for k in ["params", "grads", "optimizer", "activations", "comm", "total"]:
    p = hpred[k]
    m = max(r["host_peak_bytes"][k] for r in rows)
    ok = abs(p - m) <= max(0.10 * m, 1 << 20) and (check != "exact" or p == m)
    print("  %-12s predicted %10d measured %10d %s" %
          ("host " + k, p, m, "" if ok else "<-- off"))
    if not ok:
        bad.append("host " + k)
if (hpred["total"] > 0) != (max(r["host_peak_bytes"]["total"] for r in rows) > 0):
    bad.append("host tier used by one of prediction and measurement only")
if bad:
    sys.exit("off: " + ", ".join(bad))
EOF
}

# run_all VARIANT...: each configuration run and compared.
run_all() {
    for v in "$@"; do
        read -r -a f <<<"$v"
        name=${f[0]} np=${f[1]} how=${f[2]}
        if ! run "$name" "$np" "${f[@]:3}"; then
            fail "$name: training failed ($v)"
            show "$name"
            continue
        fi
        check "$name: predicted peaks match the measured ones ($how; ${f[*]:3})" compare "$name" "$how"
        check "$name: the prediction is printed before step 0" has_text "$TMP/$name.out" \
            "predicted per-rank peak of a step"
        check "$name: the comparison is printed at the end" has_text "$TMP/$name.out" \
            "predicted vs measured peak"
    done
}

case $VARIANT in
matrix) run_all "${VARIANTS[@]}" ;;
offload) run_all "${OFFLOAD_VARIANTS[@]}" ;;
capacity)
    run probe 1 --steps 1 || fail "probe: training failed"
    total=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["predicted_peak_bytes"]["total"])' "$TMP/probe.jsonl")
    MT_CPU_DEVICE_MEMORY=$total run fits 1
    check "capacity = the predicted total ($total bytes): the run completes" test $? -eq 0
    check "fits: said before step 0" has_text "$TMP/fits.out" "(fits: 0 B to spare)"
    MT_CPU_DEVICE_MEMORY=$((total - 1)) run short 1
    rc=$?
    check "capacity one byte below the prediction: the run fails (rc $rc)" test $rc -ne 0
    check "short: the warning before step 0" has_text "$TMP/short.out" \
        "WARNING: the predicted peak"
    check "short: the device refused an allocation" grep -q "out of memory\|exceed" "$TMP/short.err"
    ;;
*)
    fail "unknown variant '$VARIANT'"
    ;;
esac
finish
