#!/usr/bin/env bash
# safetensors both ways (issue 14 item 7), as a user runs it:
#   export   train_gpt on dp 2 x tp 2 with a vocabulary tp pads (1001), a checkpoint, mt-ckpt
#            info/verify/export; Python (numpy + safetensors, no torch) reassembles the checkpoint
#            from its files and compares names, shapes and values with the export exactly, and a
#            numpy GPT-2 forward (gpt2_numpy.py) on the export gives train_gpt's held-out loss;
#            export -> import -> export is byte-identical
#   import   a GPT-2 written the way transformers saves one (transformer.* names, config.json,
#            mask buffers, a tied lm_head copy), mt-ckpt import, train_gpt --resume on tp 2
#            (padded vocabulary) computes the numpy forward's loss, then fine-tunes from it with
#            a fresh optimizer; bad files are refused with the tensor's name
# usage: ckpt_export.sh MTRUN TRAIN_GPT MT_CKPT PYTHON VARIANT
set -u
MTRUN=$1
PROG=$2
MTCKPT=$3
PY=$4
VARIANT=$5
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TMP_PREFIX=ckpt_export
. "$HERE/../lib.sh"
export MT_TIMEOUT_S=${MT_TIMEOUT_S:-60} MT_DEVICE=cpu

if [ ! -x "$PY" ] || ! "$PY" -c 'import numpy, safetensors' 2>/dev/null; then
    echo "FAIL: $PY with numpy and safetensors is missing: run scripts/setup (it makes the venv)" >&2
    exit 1
fi

TOL=1e-6 # float64 numpy against float32 meshtrain: ~1e-7 measured
MODEL=(--layers 2 --d-model 32 --heads 4 --seq 16 --batch 4 --seed 3 --lr 1e-2)

# tokens FILE VOCAB: 6000 uint16 ids below VOCAB, including VOCAB - 1 (the padded tp slice)
tokens() {
    "$PY" - "$1" "$2" <<'PYEOF'
import numpy as np, sys
rng = np.random.default_rng(11)
ids = rng.integers(0, int(sys.argv[2]), 6000).astype("<u2")
ids[100] = int(sys.argv[2]) - 1
ids.tofile(sys.argv[1])
PYEOF
}

# val_loss METRICS STEP: the val_loss train_gpt wrote for STEP
val_loss() {
    "$PY" -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "val_loss" in r and r["step"] == int(sys.argv[2]): print(repr(r["val_loss"]))' "$1" "$2"
}

# close A B WHAT: |A - B| <= TOL x |B|
close() {
    "$PY" -c 'import sys; a, b, t = map(float, sys.argv[1:4]); sys.exit(0 if abs(a - b) <= t * abs(b) else 1)' \
        "$1" "$2" "$TOL" || { echo "  $3: $1 vs $2 (tolerance $TOL relative)" >&2; return 1; }
}

run_export() {
    tokens "$TMP/ids.bin" 1001
    check "train dp 2 x tp 2, vocab 1001, save at step 4" \
        timeout 120 "$MTRUN" --standalone --nproc_per_node 4 "$PROG" --dp 2 --tp 2 "${MODEL[@]}" \
        --vocab 1001 --token-file "$TMP/ids.bin" --steps 4 --save-every 4 --eval-every 4 \
        --checkpoint-dir "$TMP/ck" --metrics "$TMP/m.json" >"$TMP/train.out" 2>&1 || show train
    check "mt-ckpt info" "$MTCKPT" info "$TMP/ck" >"$TMP/info.out" 2>&1
    check "info names the step, the mesh and a padded-free wte [1001, 32]" \
        grep -q "model/wte.weight *\[1001, 32\]" "$TMP/info.out"
    check "info: step 4 on dp=2 tp=2" grep -q "step 4, saved by 4 rank(s) on mesh dp=2 tp=2" "$TMP/info.out"
    check "mt-ckpt verify" "$MTCKPT" verify "$TMP/ck"
    check "mt-ckpt export" "$MTCKPT" export "$TMP/ck" "$TMP/hf"
    check "python: export = the checkpoint's tensors in GPT-2 layout" \
        "$PY" "$HERE/ckpt_hf.py" check-export "$TMP/ck" "$TMP/hf"
    local want got
    want=$(val_loss "$TMP/m.json" 4)
    got=$("$PY" "$HERE/gpt2_numpy.py" "$TMP/hf" --token-file "$TMP/ids.bin" --seed 3 --seq 16 \
          --batch 4 --dp 2)
    echo "  train_gpt val loss $want, numpy GPT-2 on the export $got"
    check "numpy GPT-2 forward of the export = train_gpt's held-out loss" close "$got" "$want" loss
    check "import the export" "$MTCKPT" import "$TMP/hf/model.safetensors" "$TMP/imp"
    check "export the import" "$MTCKPT" export "$TMP/imp" "$TMP/hf2"
    check "export -> import -> export is byte-identical" \
        cmp "$TMP/hf/model.safetensors" "$TMP/hf2/model.safetensors"
}

run_import() {
    tokens "$TMP/ids.bin" 1001
    check "a GPT-2 as transformers saves it" "$PY" "$HERE/ckpt_hf.py" make-gpt2 "$TMP/hf" \
        --layers 2 --d-model 32 --heads 4 --seq 16 --vocab 1001
    check "mt-ckpt import" "$MTCKPT" import "$TMP/hf/model.safetensors" "$TMP/imp"
    check "the import is a model-only checkpoint" \
        grep -q "optimizer: none" <("$MTCKPT" info "$TMP/imp")
    check "train_gpt --resume on tp 2: held-out loss of the imported model" \
        timeout 120 "$MTRUN" --standalone --nproc_per_node 2 "$PROG" --tp 2 --batch 4 --seed 3 \
        --token-file "$TMP/ids.bin" --steps 0 --eval-every 1 --resume "$TMP/imp" \
        --metrics "$TMP/m0.json" >"$TMP/eval.out" 2>&1 || show eval
    check "it takes the model's shape from the checkpoint" \
        grep -q "GPT 2 layers, d_model 32, 4 heads, seq 16, vocab 1001" "$TMP/eval.out"
    local want got
    want=$("$PY" "$HERE/gpt2_numpy.py" "$TMP/hf" --token-file "$TMP/ids.bin" --seed 3 --seq 16 \
           --batch 4 --dp 1)
    got=$(val_loss "$TMP/m0.json" 0)
    echo "  numpy GPT-2 $want, train_gpt on the import $got"
    check "train_gpt's loss on the imported model = the numpy forward's" close "$got" "$want" loss
    check "fine-tune from the import on dp 2 (fresh optimizer)" \
        timeout 120 "$MTRUN" --standalone --nproc_per_node 2 "$PROG" --dp 2 --batch 2 --seed 3 \
        --token-file "$TMP/ids.bin" --steps 3 --resume "$TMP/imp" --lr 1e-3 \
        >"$TMP/tune.out" 2>&1 || show tune
    check "a fresh optimizer is said" grep -q "model only: a fresh optimizer" "$TMP/tune.out"
    check "a model option that differs is refused" expect_text_rc "$TMP/bad_opt" 2 \
        "--d-model 64 differs from the checkpoint's 32" \
        timeout 60 "$MTRUN" --standalone --nproc_per_node 1 "$PROG" --d-model 64 \
        --token-file "$TMP/ids.bin" --steps 1 --resume "$TMP/imp"
    # Bad files: a missing tensor, and an lm_head that is not wte.
    "$PY" - "$TMP/hf" <<'PYEOF'
import sys, os
from safetensors.numpy import load_file, save_file
d = sys.argv[1]
t = load_file(os.path.join(d, "model.safetensors"))
missing = dict(t); del missing["transformer.h.1.mlp.c_fc.bias"]
os.makedirs(d + "_missing", exist_ok=True)
save_file(missing, d + "_missing/model.safetensors", metadata={"format": "pt"})
untied = dict(t); untied["lm_head.weight"] = untied["lm_head.weight"] + 1
os.makedirs(d + "_untied", exist_ok=True)
save_file(untied, d + "_untied/model.safetensors", metadata={"format": "pt"})
PYEOF
    check "import without a tensor names it" expect_text_rc "$TMP/miss" 1 \
        "tensor 'transformer.h.1.mlp.c_fc.bias' is missing" \
        "$MTCKPT" import "$TMP/hf_missing/model.safetensors" "$TMP/bad1" --heads 4
    check "import of an untied head is refused" expect_text_rc "$TMP/untied" 1 \
        "lm_head.weight differs from transformer.wte.weight" \
        "$MTCKPT" import "$TMP/hf_untied/model.safetensors" "$TMP/bad2" --heads 4
    check "without config.json nor --heads: asks for --heads" expect_text_rc "$TMP/noheads" 1 \
        "give --heads" "$MTCKPT" import "$TMP/hf_missing/model.safetensors" "$TMP/bad3"
}

# expect_text_rc PREFIX RC TEXT CMD...: CMD exits RC and says TEXT (stdout or stderr)
expect_text_rc() {
    local prefix=$1 rc=$2 text=$3
    shift 3
    "$@" >"$prefix.out" 2>&1
    local got=$?
    if [ "$got" -ne "$rc" ] || ! grep -qF -- "$text" "$prefix.out"; then
        echo "  exit $got (want $rc); output:" >&2
        cut -c1-300 "$prefix.out" | tail -5 >&2
        return 1
    fi
}

case "$VARIANT" in
    export) run_export ;;
    import) run_import ;;
    *) echo "unknown variant $VARIANT" >&2; exit 2 ;;
esac
finish
