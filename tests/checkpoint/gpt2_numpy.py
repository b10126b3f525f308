#!/usr/bin/env python3
"""A GPT-2 forward in numpy (float64), with Hugging Face GPT2LMHeadModel's semantics, to check
what an exported meshtrain GPT computes without torch or transformers.

The model is a directory with config.json (n_layer, n_embd, n_head, n_positions, vocab_size,
layer_norm_epsilon, activation_function; scale_attn_weights, scale_attn_by_inverse_layer_idx and
tie_word_embeddings are honoured when present) and model.safetensors with HF's names, with or
without the "transformer." prefix:

  wte.weight [vocab, C]            wpe.weight [n_positions, C]
  h.N.ln_1.weight, .bias [C]       h.N.attn.c_attn.weight [C, 3C], .bias [3C]
  h.N.attn.c_proj.weight [C, C]    h.N.attn.c_proj.bias [C]
  h.N.ln_2.weight, .bias [C]       h.N.mlp.c_fc.weight [C, 4C], .bias [4C]
  h.N.mlp.c_proj.weight [4C, C]    h.N.mlp.c_proj.bias [C]
  ln_f.weight, .bias [C]           lm_head.weight [vocab, C] if not tied (a tied copy = wte)

The weights are Conv1D's (in, out), so y = x @ W + b; c_attn's output is q, k, v (C each), and
head h of each is its columns [h * C/n_head, (h + 1) * C/n_head). HF's causal-mask buffers
(h.N.attn.bias, h.N.attn.masked_bias) are not parameters and are ignored.

meshtrain's GPT (models/gpt.c) maps onto these names as follows (W.T: transposed; checked
against mt_gpt_forward on perturbed weights, agreeing to ~3e-8 relative; the semantics match:
tanh GELU, LayerNorm eps 1e-5, scale 1/sqrt(head_dim), causal mask, tied head, no head bias):

  wte.weight [vocab_pad, C]           -> wte.weight: its first vocab rows only (tp pads wte to a
                                         multiple of tp; zero rows left in would add zero logits)
  wpe.weight [seq, C]                 -> wpe.weight, n_positions = seq
  blockN.attn.qkv.weight [3, C, C]    -> h.N.attn.c_attn.weight = W.reshape(3C, C).T
  blockN.attn.qkv.bias [3, C]         -> h.N.attn.c_attn.bias = b.reshape(3C)
  blockN.attn.proj.weight [C, C]      -> h.N.attn.c_proj.weight = W.T
  blockN.mlp.fc.weight [4C, C]        -> h.N.mlp.c_fc.weight = W.T
  blockN.mlp.proj.weight [C, 4C]      -> h.N.mlp.c_proj.weight = W.T
  blockN.attn.proj.bias, mlp.fc.bias, mlp.proj.bias -> h.N.attn.c_proj.bias, h.N.mlp.c_fc.bias,
                                         h.N.mlp.c_proj.bias, as they are
  blockN.ln_1.*, blockN.ln_2.*, ln_f.* -> h.N.ln_1.*, h.N.ln_2.*, ln_f.*

Every value is computed in float64, so that a float32 model (meshtrain's) can be compared with
it tightly: expect agreement to float32 rounding (measured ~3e-8 relative on a loss; the exact
GELU moves it by ~1e-5, eps 1e-6 by ~1e-6).

The loss of a batch of token rows of seq + 1 ids is train_gpt's (and mt_gpt_forward's): inputs
are the first seq ids, targets the last seq, and the loss the mean cross-entropy over every
target. (HF's own `labels=` path shifts inside a row of seq ids and scores seq - 1 of them:
not the same number.)

eval_windows reproduces train_gpt's held-out sequences (examples/train_gpt.c, fill_batch with
eval = true), so that eval_loss gives the "val loss" train_gpt prints for the same --seed,
--batch, --seq and dp, from the same --data or --token-file.

Semantics switches, for comparing with a model that differs from GPT-2's: --gelu tanh|exact
(default: the config's activation_function; "gelu_new", "gelu_pytorch_tanh" and "gelu_fast" are
the tanh approximation, "gelu" the exact erf form) and --eps (default: layer_norm_epsilon).

--param-dtype bf16 emulates train_gpt --param-dtype bf16, whose evaluation runs on parameters
all-gathered in bf16 and multiplies bf16-rounded inputs in the four linears of each block and
the LM head (autocast's rule): every parameter and those inputs are rounded to bf16 (nearest,
ties to even, from float32) and the rest stays float64. It can agree less tightly (an
activation near a rounding boundary may round the other way); measured on train_gpt's initial
model: ~1e-7 relative, where f32 and bf16 differ by ~2e-6.

  gpt2_numpy.py DIR [--data FILE | --token-file FILE] [--seed S] [--seq T] [--batch B] [--dp D]
                [--micro-batches M] [--gelu tanh|exact] [--eps X] [--param-dtype f32|bf16]

prints the held-out loss as %.9g. Defaults are train_gpt's: --data
/usr/share/common-licenses/GPL-3, --seed 1, --batch 8, --dp 1, 4 micro-batches; --seq defaults
to the config's n_positions (train_gpt's position embedding has exactly seq rows).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import safetensors
import safetensors.numpy

DEFAULT_DATA = "/usr/share/common-licenses/GPL-3"
EVAL_MICRO_BATCHES = 4  # train_gpt.c's EVAL_MICRO_BATCHES
EVAL_SALT = 0x5EED  # train_gpt.c's fill_batch: the seed of held-out windows is seed ^ 0x5EED
MASK64 = (1 << 64) - 1

TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
EXACT_GELUS = ("gelu",)


class ModelError(Exception):
    """A model directory that cannot be read as GPT-2: the message names what is wrong."""


# ---- the model ---------------------------------------------------------------------------------


def _load_tensors(path):
    """name -> float64 array. safetensors.numpy has no bfloat16: such a file is read through
    safetensors.deserialize and widened here (bf16 is the top half of a float32)."""
    try:
        raw = safetensors.numpy.load_file(path)
        return {k: np.asarray(v, dtype=np.float64) for k, v in raw.items()}
    except (KeyError, TypeError):  # a dtype numpy lacks (BF16); versions differ in the error
        pass
    with open(path, "rb") as f:
        entries = safetensors.deserialize(f.read())
    out = {}
    numpy_types = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
                   "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
                   "BOOL": np.bool_}  # integers: HF's causal-mask buffers, which are ignored
    for name, t in entries:
        data = bytes(t["data"])
        if t["dtype"] == "BF16":
            half = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
            arr = half.view(np.float32)
        elif t["dtype"] in numpy_types:
            arr = np.frombuffer(data, dtype=np.dtype(numpy_types[t["dtype"]]).newbyteorder("<"))
        else:
            raise ModelError(f"{path}: tensor '{name}' has dtype {t['dtype']}, which this "
                             f"reader does not know")
        out[name] = arr.reshape(t["shape"]).astype(np.float64)
    return out


def _bf16(x):
    """x rounded to bfloat16 as meshtrain rounds a float32 (core/bf16_inline.h: to nearest, ties
    to even; its inputs are finite), returned as float64."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    kept = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return kept.astype(np.uint32).view(np.float32).astype(np.float64)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


_erf = np.vectorize(math.erf, otypes=[np.float64])  # numpy has no erf; math.erf is exact enough


def _gelu_exact(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _layernorm(x, w, b, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased, as torch's layer_norm
    return (x - mean) / np.sqrt(var + eps) * w + b


class GPT2:
    """The weights (float64) and configuration of one GPT-2; loss() runs the forward."""

    def __init__(self, config, tensors, gelu=None, eps=None, param_dtype="f32", where="model"):
        def need(key):
            if key not in config:
                raise ModelError(f"{where}: config.json has no '{key}'")
            return config[key]

        self.layers = int(need("n_layer"))
        self.C = int(need("n_embd"))
        self.heads = int(need("n_head"))
        self.n_positions = int(need("n_positions"))
        self.vocab = int(need("vocab_size"))
        self.eps = float(config.get("layer_norm_epsilon", 1e-5)) if eps is None else float(eps)
        act = config.get("activation_function", "gelu_new")
        if gelu is None:
            if act in TANH_GELUS:
                gelu = "tanh"
            elif act in EXACT_GELUS:
                gelu = "exact"
            else:
                raise ModelError(f"{where}: activation_function '{act}' is not a GELU this "
                                 f"model knows ({', '.join(TANH_GELUS + EXACT_GELUS)})")
        if gelu not in ("tanh", "exact"):
            raise ModelError(f"gelu '{gelu}' must be tanh or exact")
        self.gelu = gelu
        if param_dtype not in ("f32", "bf16"):
            raise ModelError(f"param_dtype '{param_dtype}' must be f32 or bf16")
        self.bf16 = param_dtype == "bf16"
        self.act = _gelu_tanh if gelu == "tanh" else _gelu_exact
        self.scale_attn = bool(config.get("scale_attn_weights", True))
        self.scale_by_layer = bool(config.get("scale_attn_by_inverse_layer_idx", False))
        if self.C % self.heads != 0:
            raise ModelError(f"{where}: n_embd {self.C} not divisible by n_head {self.heads}")
        self.head_dim = self.C // self.heads
        inner = int(config.get("n_inner") or 4 * self.C)  # HF: n_inner, or 4 x n_embd when null
        tied = bool(config.get("tie_word_embeddings", True))

        # HF names, with the "transformer." prefix or without (never both for one tensor).
        t = {}
        for name, value in tensors.items():
            short = name[len("transformer."):] if name.startswith("transformer.") else name
            if short in t:
                raise ModelError(f"{where}: '{short}' appears with and without 'transformer.'")
            t[short] = _bf16(value) if param_dtype == "bf16" else value
        used = set()

        def get(name, shape):
            if name not in t:
                raise ModelError(f"{where}: model.safetensors has no '{name}' (nor "
                                 f"'transformer.{name}')")
            if tuple(t[name].shape) != tuple(shape):
                raise ModelError(f"{where}: '{name}' has shape {list(t[name].shape)}, expected "
                                 f"{list(shape)}")
            used.add(name)
            return t[name]

        C = self.C
        self.wte = get("wte.weight", (self.vocab, C))
        self.wpe = get("wpe.weight", (self.n_positions, C))
        self.blocks = []
        for i in range(self.layers):
            p = f"h.{i}."
            self.blocks.append({
                "ln_1.w": get(p + "ln_1.weight", (C,)), "ln_1.b": get(p + "ln_1.bias", (C,)),
                "attn.w": get(p + "attn.c_attn.weight", (C, 3 * C)),
                "attn.b": get(p + "attn.c_attn.bias", (3 * C,)),
                "proj.w": get(p + "attn.c_proj.weight", (C, C)),
                "proj.b": get(p + "attn.c_proj.bias", (C,)),
                "ln_2.w": get(p + "ln_2.weight", (C,)), "ln_2.b": get(p + "ln_2.bias", (C,)),
                "fc.w": get(p + "mlp.c_fc.weight", (C, inner)),
                "fc.b": get(p + "mlp.c_fc.bias", (inner,)),
                "mproj.w": get(p + "mlp.c_proj.weight", (inner, C)),
                "mproj.b": get(p + "mlp.c_proj.bias", (C,)),
            })
        self.ln_f_w = get("ln_f.weight", (C,))
        self.ln_f_b = get("ln_f.bias", (C,))
        if tied:  # GPT-2's default: the head is wte; a stored copy must be the same
            self.head = self.wte
            if "lm_head.weight" in t:
                if not np.array_equal(get("lm_head.weight", (self.vocab, C)), self.wte):
                    raise ModelError(f"{where}: lm_head.weight differs from wte.weight, but "
                                     f"tie_word_embeddings makes them one tensor")
        else:
            self.head = get("lm_head.weight", (self.vocab, C))
        # A tensor nothing reads is an export mistake (a wrong name, a layer too many), except
        # the causal-mask buffers some HF checkpoints carry.
        for name in sorted(set(t) - used):
            parts = name.split(".")
            if not (len(parts) == 4 and parts[0] == "h" and parts[2] == "attn"
                    and parts[3] in ("bias", "masked_bias")):
                raise ModelError(f"{where}: model.safetensors has '{name}', which is no "
                                 f"parameter of a {self.layers}-layer GPT-2")

    def _mm(self, x, w):
        """A linear's product; under bf16 its input is rounded first, as autocast does."""
        return (_bf16(x) if self.bf16 else x) @ w

    def _attention(self, x, blk, layer):
        B, T, C = x.shape
        nh, hd = self.heads, self.head_dim
        qkv = self._mm(x, blk["attn.w"]) + blk["attn.b"]  # B, T, 3C: q | k | v
        q, k, v = (qkv[..., s * C:(s + 1) * C].reshape(B, T, nh, hd).transpose(0, 2, 1, 3)
                   for s in range(3))  # B, nh, T, hd: head h is columns [h hd, (h + 1) hd)
        att = q @ k.transpose(0, 1, 3, 2)
        if self.scale_attn:
            att = att / math.sqrt(hd)
        if self.scale_by_layer:
            att = att / float(layer + 1)
        future = np.triu(np.ones((T, T), dtype=bool), k=1)
        att = np.where(future, -np.inf, att)
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att = att / att.sum(axis=-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        return self._mm(y, blk["proj.w"]) + blk["proj.b"]

    def _token_losses(self, rows):
        inputs, targets = rows[:, :-1], rows[:, 1:]
        T = inputs.shape[1]
        x = self.wte[inputs] + self.wpe[:T]
        for i, blk in enumerate(self.blocks):
            x = x + self._attention(_layernorm(x, blk["ln_1.w"], blk["ln_1.b"], self.eps), blk, i)
            h = _layernorm(x, blk["ln_2.w"], blk["ln_2.b"], self.eps)
            f = self.act(self._mm(h, blk["fc.w"]) + blk["fc.b"])
            x = x + self._mm(f, blk["mproj.w"]) + blk["mproj.b"]
        logits = self._mm(_layernorm(x, self.ln_f_w, self.ln_f_b, self.eps), self.head.T)
        mx = logits.max(axis=-1, keepdims=True)
        lse = np.log(np.exp(logits - mx).sum(axis=-1)) + mx[..., 0]
        return lse - np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]

    def loss(self, rows):
        """Mean cross-entropy of rows (N x (seq + 1) ids): inputs the first seq, targets the
        last seq, as mt_gpt_forward."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim != 2 or rows.shape[1] < 2:
            raise ValueError(f"token rows must be N x (seq + 1) with seq >= 1, not {rows.shape}")
        seq = rows.shape[1] - 1
        if seq > self.n_positions:
            raise ValueError(f"seq {seq} is longer than n_positions {self.n_positions}")
        bad = np.argwhere((rows < 0) | (rows >= self.vocab))
        if len(bad):
            r, c = bad[0]
            raise ValueError(f"token {rows[r, c]} at row {r}, position {c} is outside the "
                             f"vocabulary [0, {self.vocab})")
        # Chunks of rows keep the largest activation (logits, or the attention scores) to about
        # 2^25 float64 values, whatever the vocabulary.
        widest = max(self.vocab, 4 * self.C, self.heads * seq)
        chunk = max(1, (1 << 25) // (seq * widest))
        total = 0.0
        for i in range(0, rows.shape[0], chunk):
            total += float(self._token_losses(rows[i:i + chunk]).sum())
        return total / (rows.shape[0] * seq)


def load_model(directory, gelu=None, eps=None, param_dtype="f32"):
    """The GPT2 of directory/config.json and directory/model.safetensors."""
    cfg_path = os.path.join(directory, "config.json")
    st_path = os.path.join(directory, "model.safetensors")
    for p in (cfg_path, st_path):
        if not os.path.isfile(p):
            raise ModelError(f"model directory '{directory}' has no {os.path.basename(p)}")
    with open(cfg_path) as f:
        config = json.load(f)
    return GPT2(config, _load_tensors(st_path), gelu=gelu, eps=eps, param_dtype=param_dtype,
                where=directory)


# ---- train_gpt's data and held-out windows ---------------------------------------------------


def read_ids(data=None, token_file=None):
    """train_gpt's token ids: the bytes of data, or the little-endian uint16 ids of token_file."""
    if token_file is not None:
        raw = np.fromfile(token_file, dtype=np.uint8)
        if raw.size % 2:
            raise ValueError(f"token file '{token_file}' has {raw.size} bytes: not a whole "
                             f"number of 2-byte (little-endian uint16) token ids")
        return raw.view("<u2").astype(np.int64)
    return np.fromfile(data if data is not None else DEFAULT_DATA, dtype=np.uint8).astype(np.int64)


def mix64(x):
    """train_gpt.c's mix64 (a splitmix64 finaliser) on Python ints, modulo 2^64."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def split(ids):
    """(train_len, val_len): the last n // 10 ids are held out."""
    val_len = len(ids) // 10
    return len(ids) - val_len, val_len


def eval_windows(ids, seed, seq, batch, dp, micro_batches=EVAL_MICRO_BATCHES):
    """train_gpt's held-out rows: [dp rank][micro-batch] -> batch x (seq + 1) ids, as fill_batch
    with eval = true and step 0 draws them (every evaluation uses the same ones)."""
    train_len, val_len = split(ids)
    if val_len < seq + 1:
        raise ValueError(f"seq {seq} is longer than the held-out data: a sequence needs "
                         f"{seq + 1} ids but the last 10% of {len(ids)} has {val_len}")
    starts = val_len - seq
    out = []
    for r in range(dp):
        per_rank = []
        for m in range(micro_batches):
            rows = []
            for b in range(batch):
                h = mix64((seed ^ EVAL_SALT) & MASK64)
                h = mix64(h ^ 0)  # step: evaluation always draws step 0's windows
                h = mix64(h ^ m)
                h = mix64(h ^ ((r * batch + b) & MASK64))
                s = train_len + h % starts
                rows.append(ids[s:s + seq + 1])
            per_rank.append(np.stack(rows))
        out.append(per_rank)
    return out


def eval_loss(model, ids, seed, seq, batch, dp, micro_batches=EVAL_MICRO_BATCHES):
    """train_gpt's held-out loss: each dp rank's mean over its micro-batches of mt_gpt_forward's
    mean, then the mean over dp ranks (all the same size, so the mean over every token)."""
    bad = np.flatnonzero(ids >= model.vocab)
    if bad.size:  # as train_gpt, named by its place in the data, not in some window
        raise ValueError(f"token id {ids[bad[0]]} at position {bad[0]} of the data is not below "
                         f"the model's vocab_size {model.vocab}")
    windows = eval_windows(ids, seed, seq, batch, dp, micro_batches)
    per_rank = [sum(model.loss(rows) for rows in rank) / micro_batches for rank in windows]
    return sum(per_rank) / dp


# ---- command line ------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description="train_gpt's held-out loss of an exported GPT-2, "
                                 "in float64 numpy with Hugging Face GPT-2's semantics")
    ap.add_argument("model", metavar="DIR", help="config.json and model.safetensors")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--data", metavar="FILE", help=f"bytes as tokens (default {DEFAULT_DATA})")
    src.add_argument("--token-file", metavar="FILE", help="little-endian uint16 token ids")
    ap.add_argument("--seed", type=int, default=1, help="train_gpt's --seed (1)")
    ap.add_argument("--seq", type=int, help="train_gpt's --seq (default: n_positions)")
    ap.add_argument("--batch", type=int, default=8, help="train_gpt's --batch (8)")
    ap.add_argument("--dp", type=int, default=1, help="train_gpt's dp size (1)")
    ap.add_argument("--micro-batches", type=int, default=EVAL_MICRO_BATCHES,
                    help=f"held-out micro-batches per dp rank ({EVAL_MICRO_BATCHES})")
    ap.add_argument("--gelu", choices=("tanh", "exact"),
                    help="GELU form (default: from activation_function)")
    ap.add_argument("--eps", type=float, help="LayerNorm epsilon (default: layer_norm_epsilon)")
    ap.add_argument("--param-dtype", choices=("f32", "bf16"), default="f32",
                    help="train_gpt's --param-dtype: bf16 emulates its rounding (f32)")
    a = ap.parse_args(argv)
    for name in ("batch", "dp", "micro_batches"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(a, name)} must be >= 1")
    if a.seed < 0 or a.seed > MASK64:
        ap.error(f"--seed {a.seed} must be an unsigned 64-bit integer")
    try:
        model = load_model(a.model, gelu=a.gelu, eps=a.eps, param_dtype=a.param_dtype)
        seq = a.seq if a.seq is not None else model.n_positions
        if seq < 1:
            ap.error(f"--seq {seq} must be >= 1")
        ids = read_ids(a.data, a.token_file)
        loss = eval_loss(model, ids, a.seed, seq, a.batch, a.dp, a.micro_batches)
    except (ModelError, ValueError, OSError) as e:
        print(f"gpt2_numpy: {e}", file=sys.stderr)
        return 2
    print("%.9g" % loss)
    return 0


if __name__ == "__main__":
    sys.exit(main())
