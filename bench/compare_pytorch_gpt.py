"""PyTorch side of bench/compare_pytorch.sh: train_gpt's GPT trained with FSDP2 (+ TP) on gloo.

Started by torchrun, one process per rank. The model is written to match models/gpt.c and the
run to match examples/train_gpt.c with their defaults:
  - GPT-2: token and position embeddings, pre-LayerNorm blocks (eps 1e-5), qkv as one linear,
    causal attention, tanh GELU MLP of 4 x d_model, final LayerNorm, LM head tied to the token
    embedding, byte vocabulary (256);
  - GPT-2 init: normal std 0.02, the two residual projections 0.02 / sqrt(2 layers), biases 0,
    LayerNorm weights 1 (the values differ from meshtrain's, which come from its own hash; the
    distribution is the same);
  - the data: the file's bytes, the last 10% held out, each sequence a window of seq + 1 bytes
    at a position drawn from train_gpt's hash of (seed, step, micro-batch, index in the global
    batch), so both sides train on the same sequences;
  - AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay; the global gradient norm
    clipped to 1; f32 throughout.
The qkv linear's output is laid out head by head (q, k, v of head 0, then of head 1, ...), so
that ColwiseParallel's contiguous split of its rows gives each tp rank whole heads, as
meshtrain's [3, C, C] weight split on its C dimension does. With tp > 1 the token embedding is
vocabulary-parallel (RowwiseParallel on the embedding) and so is the tied head with its
cross-entropy (loss_parallel), as in meshtrain.

Rank 0 prints one JSON line per step: {"step", "loss", "step_ms"}, then {"params": N}. A step
is timed with time.perf_counter from before the forward to after the loss's all-reduce over dp,
the span of train_gpt's step_ms.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

MASK64 = (1 << 64) - 1


def mix64(x):
    """train_gpt.c's mix64 (splitmix64's finaliser), on unsigned 64-bit integers."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def window_starts(seed, step, micro, first, count, starts):
    """The window positions of global-batch sequences first .. first + count - 1, as
    train_gpt's fill_batch draws them for training (not evaluation)."""
    out = []
    for i in range(first, first + count):
        h = mix64(seed)
        h = mix64(h ^ step)
        h = mix64(h ^ micro)
        h = mix64(h ^ i)
        out.append(h % starts)
    return out


class Block(nn.Module):
    def __init__(self, C, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=1e-5)
        self.fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU(approximate="tanh")
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        qkv = self.qkv(self.ln1(x))  # under TP: this rank's heads only
        hd = C // self.heads
        h = qkv.shape[-1] // (3 * hd)
        q, k, v = qkv.view(B, T, h, 3, hd).permute(3, 0, 2, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, h * hd))
        return x + self.mlp_proj(self.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, seq, C, heads, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, C)
        self.wpe = nn.Embedding(seq, C)
        self.blocks = nn.ModuleList(Block(C, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.tp_mesh = None  # set by parallelize when tp > 1

    def init_weights(self, layers):
        std, res_std = 0.02, 0.02 / math.sqrt(2.0 * layers)
        for name, p in self.named_parameters():
            if name.endswith("attn_proj.weight") or name.endswith("mlp_proj.weight"):
                nn.init.normal_(p, 0.0, res_std)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("ln_f"):
                nn.init.ones_(p)
            else:  # wte, wpe, qkv.weight, fc.weight
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids, targets):
        T = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(T))
        for blk in self.blocks:
            x = blk(x)
        x = self.ln_f(x)
        w = self.wte.weight
        if self.tp_mesh is None:
            logits = F.linear(x, w)
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        # Vocabulary-parallel head: x is replicated over tp, the tied weight split by rows, so
        # the logits come out split by columns and the loss is computed on them where they lie.
        from torch.distributed.tensor import DTensor, Replicate
        xd = DTensor.from_local(x, self.tp_mesh, [Replicate()], run_check=False)
        logits = F.linear(xd, w)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def parallelize(model, mesh, dp, tp):
    from torch.distributed.fsdp import fully_shard
    if tp > 1:
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
        tp_mesh = mesh["tp"]
        plan = {"qkv": ColwiseParallel(), "attn_proj": RowwiseParallel(),
                "fc": ColwiseParallel(), "mlp_proj": RowwiseParallel()}
        for blk in model.blocks:
            parallelize_module(blk, tp_mesh, plan)
        parallelize_module(model, tp_mesh, {"wte": RowwiseParallel(input_layouts=Replicate())})
        model.tp_mesh = tp_mesh
    dp_mesh = mesh["dp"]
    for blk in model.blocks:
        fully_shard(blk, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)


def clip_tp(params, max_norm, tp):
    """clip_grad_norm_ for a model whose gradients are DTensors on two meshes (the tp-split ones
    on dp x tp, the replicated ones on dp), which torch's own refuses to stack: one all-reduce
    over every rank of the shards' sums of squares, the tp-replicated ones counted once."""
    from torch.distributed.tensor import DTensor
    split = torch.zeros((), dtype=torch.float64)
    rep = torch.zeros((), dtype=torch.float64)
    locs = []
    for p in params:
        g = p.grad
        if g is None:
            continue
        loc = g.to_local() if isinstance(g, DTensor) else g
        locs.append(loc)
        s = loc.double().pow(2).sum()
        tp_split = isinstance(g, DTensor) and g.device_mesh.ndim == 2 and g.placements[1].is_shard()
        if tp_split:
            split += s
        else:
            rep += s
    total = split + rep / tp
    dist.all_reduce(total)
    norm = float(total.sqrt())
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for loc in locs:
            loc.mul_(coef)
    return norm


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dp", type=int, required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, required=True, help="sequences per dp rank")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--data", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--threads", type=int, required=True, help="torch.set_num_threads per rank")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if a.dp * a.tp != world:
        raise SystemExit(f"compare_pytorch_gpt: dp {a.dp} x tp {a.tp} != world size {world}")
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (a.dp, a.tp), mesh_dim_names=("dp", "tp"))
    dp_rank = rank // a.tp  # row-major, as train_gpt's mesh

    data = torch.frombuffer(bytearray(open(a.data, "rb").read()), dtype=torch.uint8).long()
    train_len = data.numel() - data.numel() // 10
    starts = train_len - a.seq

    torch.manual_seed(a.seed)
    model = GPT(a.vocab, a.seq, a.d_model, a.heads, a.layers)
    model.init_weights(a.layers)
    n_params = sum(p.numel() for p in model.parameters())  # the tied weight once
    parallelize(model, mesh, a.dp, a.tp)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    dp_group = mesh["dp"].get_group()
    if a.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

    for step in range(a.steps):
        pos = window_starts(a.seed, step, 0, dp_rank * a.batch, a.batch, starts)
        rows = torch.stack([data[s:s + a.seq + 1] for s in pos])
        ids, targets = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        t0 = time.perf_counter()
        if a.tp > 1:
            with loss_parallel():
                loss = model(ids, targets)
                loss.backward()
            loss = loss.full_tensor()
            clip_tp(model.parameters(), a.clip, a.tp)
        else:
            loss = model(ids, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach().clone()
        dist.all_reduce(loss, op=dist.ReduceOp.SUM, group=dp_group)
        loss /= a.dp
        ms = (time.perf_counter() - t0) * 1e3
        if rank == 0:
            print(json.dumps({"step": step, "loss": float(loss), "step_ms": ms}), flush=True)
    if rank == 0:
        print(json.dumps({"params": n_params, "threads": a.threads}), flush=True)
    # Every rank is done: leave without tearing gloo down, whose threads sometimes abort the
    # process on the way out ("terminate called without an active exception", seen here about
    # 3 of some 40 launches with torch 2.15, after all steps had completed), failing the launch.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
