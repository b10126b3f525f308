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
"$PY" - "$TMP/hf" "$TMP/m.json" "$HERE" <<'PYEOF'
import json, sys
import numpy as np
import torch
import transformers
sys.path.insert(0, sys.argv[3])
import gpt2_numpy

hf_dir, metrics = sys.argv[1], sys.argv[2]
want = [json.loads(l)["val_loss"] for l in open(metrics) if "val_loss" in l][-1]
model = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
ids = gpt2_numpy.read_ids(data="/usr/share/common-licenses/GPL-3")
rows = gpt2_numpy.eval_windows(ids, seed=5, seq=32, batch=4, dp=2)
losses = []
with torch.no_grad():
    for micro in (m for rank in rows for m in rank):
        x = torch.tensor(np.asarray(micro), dtype=torch.long)
        logits = model(x[:, :-1]).logits.double()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 x[:, 1:].reshape(-1))
        losses.append(loss.item())
hf = float(np.mean(losses))
npy = gpt2_numpy.eval_loss(gpt2_numpy.load_model(hf_dir), ids, seed=5, seq=32, batch=4, dp=2)
print("transformers %s GPT2LMHeadModel.from_pretrained: %.9g" % (transformers.__version__, hf))
print("numpy GPT-2 forward:                            %.9g" % npy)
print("train_gpt (dp 2 x tp 2) held-out loss:          %.9g" % want)
rel = abs(hf - want) / abs(want)
print("transformers vs train_gpt: %.2e relative -> %s" % (rel, "OK" if rel <= 1e-5 else "FAIL"))
sys.exit(0 if rel <= 1e-5 else 1)
PYEOF

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
"$PY" - "$TMP/hf_orig" "$TMP/m_imp.json" "$HERE" "$TMP/ids.bin" <<'PYEOF'
import json, sys
import numpy as np
import torch
import transformers
sys.path.insert(0, sys.argv[3])
import gpt2_numpy

want = [json.loads(l)["val_loss"] for l in open(sys.argv[2]) if "val_loss" in l][-1]
model = transformers.GPT2LMHeadModel.from_pretrained(sys.argv[1]).eval()
ids = gpt2_numpy.read_ids(token_file=sys.argv[4])
rows = gpt2_numpy.eval_windows(ids, seed=5, seq=32, batch=4, dp=1)
losses = []
with torch.no_grad():
    for micro in (m for rank in rows for m in rank):
        x = torch.tensor(np.asarray(micro, dtype=np.int64))
        logits = model(x[:, :-1]).logits.double()
        losses.append(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item())
hf = float(np.mean(losses))
print("import: transformers on its own save_pretrained: %.9g" % hf)
print("import: train_gpt (tp 2) on mt-ckpt import of it: %.9g" % want)
rel = abs(hf - want) / abs(want)
print("transformers vs train_gpt: %.2e relative -> %s" % (rel, "OK" if rel <= 1e-5 else "FAIL"))
sys.exit(0 if rel <= 1e-5 else 1)
PYEOF
