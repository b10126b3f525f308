#!/usr/bin/env python3
"""transformers' side of hf_from_pretrained.sh (not in CI: it needs torch and transformers).

  hf_eval.py DIR METRICS DATA_KIND DATA_FILE SEED SEQ BATCH DP LABEL

GPT2LMHeadModel.from_pretrained(DIR) computes the held-out loss on train_gpt's evaluation windows
(gpt2_numpy.eval_windows: the rows train_gpt draws for --seed/--seq/--batch/dp from --data or
--token-file, DATA_KIND "data" or "token_file"); it is compared with the last val_loss of
train_gpt's --metrics file METRICS and, as a third opinion, with the numpy forward. Exit 0 when
transformers and train_gpt agree to 1e-5 relative.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_numpy  # noqa: E402


def main():
    hf_dir, metrics, kind, data, seed, seq, batch, dp, label = sys.argv[1:10]
    seed, seq, batch, dp = int(seed), int(seq), int(batch), int(dp)
    want = [json.loads(l)["val_loss"] for l in open(metrics) if "val_loss" in l][-1]
    ids = gpt2_numpy.read_ids(**{kind: data})
    model = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    rows = gpt2_numpy.eval_windows(ids, seed=seed, seq=seq, batch=batch, dp=dp)
    losses = []
    with torch.no_grad():
        for micro in (m for rank in rows for m in rank):
            x = torch.tensor(np.asarray(micro, dtype=np.int64))
            logits = model(x[:, :-1]).logits.double()
            losses.append(torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item())
    hf = float(np.mean(losses))
    npy = gpt2_numpy.eval_loss(gpt2_numpy.load_model(hf_dir), ids, seed=seed, seq=seq,
                               batch=batch, dp=dp)
    rel = abs(hf - want) / abs(want)
    print("%s: transformers %s from_pretrained %.9g, numpy forward %.9g, train_gpt %.9g: "
          "%.2e relative -> %s" % (label, transformers.__version__, hf, npy, want, rel,
                                   "OK" if rel <= 1e-5 else "FAIL"))
    sys.exit(0 if rel <= 1e-5 else 1)


if __name__ == "__main__":
    main()
