#!/usr/bin/env python3
"""Python side of the safetensors export/import tests (tests/checkpoint/ckpt_export.sh).

  ckpt_hf.py check-export CKPT DIR   reassembles every model tensor of a meshtrain checkpoint
                                     from metadata.json and the rank files with numpy (its own
                                     reading of the format, independent of the C code), maps it
                                     to Hugging Face GPT-2 names and layout, and compares names,
                                     shapes and values exactly with DIR/model.safetensors and
                                     DIR/config.json
  ckpt_hf.py make-gpt2 DIR --layers L --d-model C --heads H --seq T --vocab V [--seed S]
                                     writes a random GPT-2 the way transformers saves one
                                     (transformer.* names, config.json) plus the extras other
                                     files carry: HF's attention-mask buffers and a tied lm_head
"""
import argparse
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file


def fail(msg):
    print("ckpt_hf.py: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def read_checkpoint(ckpt):
    if not os.path.exists(os.path.join(ckpt, "metadata.json")):
        with open(os.path.join(ckpt, "latest")) as f:
            ckpt = os.path.join(ckpt, f.read().strip())
    with open(os.path.join(ckpt, "metadata.json")) as f:
        meta = json.load(f)
    if meta["format"] != "meshtrain-checkpoint" or meta["version"] != 1:
        fail("unexpected format %r version %r" % (meta["format"], meta["version"]))
    files = {name: np.fromfile(os.path.join(ckpt, name), dtype=np.uint8) for name in meta["files"]}
    for name, info in meta["files"].items():
        if files[name].size != info["bytes"]:
            fail("%s has %d bytes, metadata says %d" % (name, files[name].size, info["bytes"]))
    tensors = {}
    for name, t in meta["tensors"].items():
        if not name.startswith("model/"):
            continue
        if t["dtype"] != "f32":
            fail("%s: dtype %s" % (name, t["dtype"]))
        full = np.full(t["shape"], np.nan, dtype=np.float32)
        for c in t["chunks"]:
            raw = files[c["file"]][c["offset"]:c["offset"] + c["bytes"]]
            box = raw.view("<f4").reshape(c["extents"])
            index = tuple(slice(o, o + e) for o, e in zip(c["offsets"], c["extents"]))
            full[index] = box
        if np.isnan(full).any():
            fail("%s: elements no chunk holds" % name)
        tensors[name[len("model/"):]] = full
    return meta, tensors


def to_hf(ours, layers):
    """meshtrain's GPT tensors -> Hugging Face GPT-2's (transformer.* names, Conv1D layout)."""
    out = {
        "transformer.wte.weight": ours["wte.weight"],
        "transformer.wpe.weight": ours["wpe.weight"],
        "transformer.ln_f.weight": ours["ln_f.weight"],
        "transformer.ln_f.bias": ours["ln_f.bias"],
    }
    for n in range(layers):
        b, h = "block%d." % n, "transformer.h.%d." % n
        qkv = ours[b + "attn.qkv.weight"]  # [3, C(out), C(in)]
        out[h + "attn.c_attn.weight"] = qkv.reshape(-1, qkv.shape[2]).T
        out[h + "attn.c_attn.bias"] = ours[b + "attn.qkv.bias"].reshape(-1)
        out[h + "attn.c_proj.weight"] = ours[b + "attn.proj.weight"].T
        out[h + "attn.c_proj.bias"] = ours[b + "attn.proj.bias"]
        out[h + "mlp.c_fc.weight"] = ours[b + "mlp.fc.weight"].T
        out[h + "mlp.c_fc.bias"] = ours[b + "mlp.fc.bias"]
        out[h + "mlp.c_proj.weight"] = ours[b + "mlp.proj.weight"].T
        out[h + "mlp.c_proj.bias"] = ours[b + "mlp.proj.bias"]
        for ln in ("ln_1", "ln_2"):
            out[h + ln + ".weight"] = ours[b + ln + ".weight"]
            out[h + ln + ".bias"] = ours[b + ln + ".bias"]
    return out


def check_export(ckpt, out_dir):
    meta, ours = read_checkpoint(ckpt)
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    layers = cfg["n_layer"]
    wte = ours["wte.weight"]
    expect_cfg = {"model_type": "gpt2", "vocab_size": wte.shape[0], "n_embd": wte.shape[1],
                  "n_positions": ours["wpe.weight"].shape[0], "activation_function": "gelu_new",
                  "tie_word_embeddings": True}
    for k, v in expect_cfg.items():
        if cfg.get(k) != v:
            fail("config.json %s = %r, expected %r" % (k, cfg.get(k), v))
    if abs(cfg["layer_norm_epsilon"] - 1e-5) > 1e-12:
        fail("layer_norm_epsilon %r" % cfg["layer_norm_epsilon"])
    if cfg["architectures"] != ["GPT2LMHeadModel"]:
        fail("architectures %r" % cfg["architectures"])
    expect = to_hf(ours, layers)
    got = load_file(os.path.join(out_dir, "model.safetensors"))
    if set(got) != set(expect):
        fail("names differ: only in the export %s, only expected %s"
             % (sorted(set(got) - set(expect)), sorted(set(expect) - set(got))))
    for name, want in expect.items():
        have = got[name]
        if have.dtype != np.float32 or have.shape != want.shape:
            fail("%s: %s %s, expected float32 %s" % (name, have.dtype, have.shape, want.shape))
        if not np.array_equal(have, want):
            fail("%s: values differ (max |diff| %g)" % (name, np.abs(have - want).max()))
    print("check-export: %d tensors of %s match %s (names, shapes, values; config.json)"
          % (len(expect), meta["step"], out_dir))


def make_gpt2(out_dir, layers, d_model, heads, seq, vocab, seed):
    rng = np.random.default_rng(seed)
    C = d_model

    def normal(*shape, std=0.02):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    t = {"transformer.wte.weight": normal(vocab, C), "transformer.wpe.weight": normal(seq, C, std=0.01),
         "transformer.ln_f.weight": (1 + normal(C, std=0.1)), "transformer.ln_f.bias": normal(C)}
    for n in range(layers):
        h = "transformer.h.%d." % n
        t[h + "ln_1.weight"] = 1 + normal(C, std=0.1)
        t[h + "ln_1.bias"] = normal(C)
        t[h + "attn.c_attn.weight"] = normal(C, 3 * C)
        t[h + "attn.c_attn.bias"] = normal(3 * C)
        t[h + "attn.c_proj.weight"] = normal(C, C)
        t[h + "attn.c_proj.bias"] = normal(C)
        t[h + "ln_2.weight"] = 1 + normal(C, std=0.1)
        t[h + "ln_2.bias"] = normal(C)
        t[h + "mlp.c_fc.weight"] = normal(C, 4 * C)
        t[h + "mlp.c_fc.bias"] = normal(4 * C)
        t[h + "mlp.c_proj.weight"] = normal(4 * C, C)
        t[h + "mlp.c_proj.bias"] = normal(C)
        # transformers' causal-mask buffer, present in many GPT-2 files
        t[h + "attn.bias"] = np.tril(np.ones((seq, seq), dtype=np.float32)).reshape(1, 1, seq, seq)
    t["lm_head.weight"] = t["transformer.wte.weight"].copy()
    os.makedirs(out_dir, exist_ok=True)
    save_file(t, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab,
           "n_positions": seq, "n_ctx": seq, "n_embd": C, "n_layer": layers, "n_head": heads,
           "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
           "tie_word_embeddings": True}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print("make-gpt2: %s (%d layers, d_model %d, %d heads, %d positions, vocab %d)"
          % (out_dir, layers, C, heads, seq, vocab))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check-export")
    c.add_argument("ckpt")
    c.add_argument("dir")
    m = sub.add_parser("make-gpt2")
    m.add_argument("dir")
    for k in ("layers", "d-model", "heads", "seq", "vocab"):
        m.add_argument("--" + k, type=int, required=True)
    m.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    if a.cmd == "check-export":
        check_export(a.ckpt, a.dir)
    else:
        make_gpt2(a.dir, a.layers, a.d_model, a.heads, a.seq, a.vocab, a.seed)


if __name__ == "__main__":
    main()
