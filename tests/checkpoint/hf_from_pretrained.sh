#!/usr/bin/env bash
# Not in CI (transformers pulls in torch: several GB): checks that Hugging Face transformers'
# GPT2LMHeadModel.from_pretrained loads what `mt-ckpt export` writes and computes the loss
# train_gpt computes on the same held-out tokens.
#
# usage: tests/checkpoint/hf_from_pretrained.sh BUILD_DIR [VENV]
#   BUILD_DIR  a meshtrain build (bin/mtrun, bin/train_gpt, bin/mt-ckpt)
#   VENV       a virtual environment with torch, transformers, numpy and safetensors; made (with
#              pip, from PyPI) when missing. Default: /tmp/meshtrain-hf-venv
# 1. export: it trains a small GPT on dp 2 x tp 2 for 20 steps, saves, exports, and compares
#    three losses on train_gpt's held-out windows: train_gpt's, the numpy forward's
#    (gpt2_numpy.py) and transformers'.
# 2. import: transformers makes a random GPT2LMHeadModel (vocab 1001) and save_pretrained()s it;
#    mt-ckpt import; train_gpt --resume on tp 2 evaluates it on a token file; transformers
#    evaluates the same windows.
# Exit 0 when transformers agrees with train_gpt to 1e-5 relative both ways.
set -euo pipefail
BUILD=$(cd "$1" && pwd)
VENV=${2:-/tmp/meshtrain-hf-venv}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ ! -x "$VENV/bin/python3" ] || ! "$VENV/bin/python3" -c 'import torch, transformers' 2>/dev/null; then
    echo "hf_from_pretrained: making $VENV (torch, transformers: a few GB)"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q numpy safetensors torch transformers
fi
PY=$VENV/bin/python3
TMP=$(mktemp -d /tmp/hf_from_pretrained.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export MT_DEVICE=cpu
"$BUILD/bin/mtrun" --standalone --nproc_per_node 4 "$BUILD/bin/train_gpt" --dp 2 --tp 2 \
    --layers 2 --d-model 64 --heads 4 --seq 32 --batch 4 --steps 20 --save-every 20 \
    --eval-every 20 --seed 5 --checkpoint-dir "$TMP/ck" --metrics "$TMP/m.json" >/dev/null
"$BUILD/bin/mt-ckpt" export "$TMP/ck" "$TMP/hf"
"$PY" "$HERE/hf_eval.py" "$TMP/hf" "$TMP/m.json" data /usr/share/common-licenses/GPL-3 5 32 4 2 \
    "export of a dp 2 x tp 2 run"

# 2. import what transformers saves
"$PY" - "$TMP/hf_orig" "$TMP/ids.bin" <<'PYEOF'
import sys
import numpy as np
import transformers
torch_seed = 3
import torch
torch.manual_seed(torch_seed)
cfg = transformers.GPT2Config(vocab_size=1001, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                              bos_token_id=None, eos_token_id=None)
transformers.GPT2LMHeadModel(cfg).save_pretrained(sys.argv[1])
rng = np.random.default_rng(4)
rng.integers(0, 1001, 8000).astype("<u2").tofile(sys.argv[2])
PYEOF
"$BUILD/bin/mt-ckpt" import "$TMP/hf_orig/model.safetensors" "$TMP/imp"
"$BUILD/bin/mtrun" --standalone --nproc_per_node 2 "$BUILD/bin/train_gpt" --tp 2 --batch 4 \
    --seed 5 --token-file "$TMP/ids.bin" --steps 0 --eval-every 1 --resume "$TMP/imp" \
    --metrics "$TMP/m_imp.json" >/dev/null
"$PY" "$HERE/hf_eval.py" "$TMP/hf_orig" "$TMP/m_imp.json" token_file "$TMP/ids.bin" 5 32 4 1 \
    "import of transformers' save_pretrained, evaluated by train_gpt on tp 2"
