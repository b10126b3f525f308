"""llm.c's CPU trainer (train_gpt2.c) built for the GPT of bench/compare_pytorch.py, for the third
column of issue 20's table (single process, OpenMP threads = the machine's cores).

llm.c is not vendored and this machine cannot fetch it: pass a checkout of
github.com/karpathy/llm.c with --llmc DIR. Its train_gpt2.c is copied into a scratch directory
and built there with `cc -Ofast -fopenmp -march=native` (as llm.c's Makefile builds it); the
copy's main() is edited with exact-text replacements, each checked, so a different llm.c fails
loudly instead of timing something else:
  - batch and sequence length: llm.c hard-codes B = 4, T = 64; they become the comparison's
    global batch and seq;
  - the step count: --steps training steps (llm.c runs 41);
  - no validation passes after step 0 and no text generation: both are outside the timed step
    but would make a run minutes longer.
The model is written in llm.c's checkpoint format (version 3, f32): 12 x 768, 12 heads,
vocabulary 256 padded to 256, maxT = seq, GPT-2 init (normal 0.02, the residual projections
too, as llm.c's own init script does not rescale them: the step time does not depend on it),
LayerNorm weights 1, biases 0. The tokens are random bytes in llm.c's token-file format
(version 1, uint16), written where train_gpt2.c looks for tiny_shakespeare. Its step time is the
"took N ms" it prints: forward, zero_grad, backward and AdamW of one batch, as timed by llm.c.
"""

import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

# Replacements in train_gpt2.c's main(), each of which must match exactly once.
EDITS = [
    (r"int B = 4;", "int B = {batch};"),
    (r"int T = 64;", "int T = {seq};"),
    (r"step <= 40;", "step < {steps};"),
    (r"if \(step % 10 == 0\)", "if (step == 0)"),
    (r"if \(step > 0 && step % 20 == 0\)", "if (0)"),
]


def _write_checkpoint(path, layers, d_model, heads, vocab, seq, seed):
    rng = np.random.default_rng(seed)
    header = np.zeros(256, np.int32)
    header[:8] = [20240326, 3, seq, vocab, layers, heads, d_model, vocab]
    L, C = layers, d_model

    def normal(*shape):
        return rng.normal(0.0, 0.02, shape).astype(np.float32)

    ones = lambda *s: np.ones(s, np.float32)  # noqa: E731
    zeros = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    # llm.c's parameter order: wte, wpe, ln1 w/b, qkv w/b, attention proj w/b, ln2 w/b,
    # fc w/b, fc proj w/b, final ln w/b.
    tensors = [normal(vocab, C), normal(seq, C), ones(L, C), zeros(L, C),
               normal(L, 3 * C, C), zeros(L, 3 * C), normal(L, C, C), zeros(L, C),
               ones(L, C), zeros(L, C), normal(L, 4 * C, C), zeros(L, 4 * C),
               normal(L, C, 4 * C), zeros(L, C), ones(C), zeros(C)]
    with open(path, "wb") as f:
        header.tofile(f)
        for t in tensors:
            t.tofile(f)
    return sum(t.size for t in tensors)


def _write_tokens(path, count, vocab, seed):
    header = np.zeros(256, np.int32)
    header[:3] = [20240520, 1, count]
    with open(path, "wb") as f:
        header.tofile(f)
        np.random.default_rng(seed).integers(0, vocab, count).astype(np.uint16).tofile(f)


class LlmC:
    """A built llm.c trainer in a scratch directory; run() trains once and returns step times."""

    def __init__(self, src_dir, layers, d_model, heads, seq, batch, steps, vocab=256, seed=1):
        main_c = os.path.join(src_dir, "train_gpt2.c")
        if not os.path.isfile(main_c) or not os.path.isdir(os.path.join(src_dir, "llmc")):
            raise RuntimeError(f"--llmc {src_dir}: no train_gpt2.c and llmc/ there "
                               "(a checkout of github.com/karpathy/llm.c)")
        self.dir = tempfile.mkdtemp(prefix="compare_llmc.")
        shutil.copytree(os.path.join(src_dir, "llmc"), os.path.join(self.dir, "llmc"))
        text = open(main_c).read()
        values = {"batch": batch, "seq": seq, "steps": steps}
        for pattern, repl in EDITS:
            text, n = re.subn(pattern, repl.format(**values), text)
            if n != 1:
                raise RuntimeError(f"llm.c's train_gpt2.c: '{pattern}' matched {n} times, not "
                                   "once: this llm.c differs from the one compare_llmc.py knows")
        with open(os.path.join(self.dir, "train_gpt2.c"), "w") as f:
            f.write(text)
        self.params = _write_checkpoint(os.path.join(self.dir, "gpt2_124M.bin"), layers,
                                        d_model, heads, vocab, seq, seed)
        data = os.path.join(self.dir, "dev", "data", "tinyshakespeare")
        os.makedirs(data)
        tokens = max(4096, 4 * batch * seq * (steps + 8))
        _write_tokens(os.path.join(data, "tiny_shakespeare_train.bin"), tokens, vocab, seed)
        _write_tokens(os.path.join(data, "tiny_shakespeare_val.bin"), tokens, vocab, seed + 1)
        cc = os.environ.get("CC", "cc")
        build = [cc, "-Ofast", "-fopenmp", "-march=native", "-Wno-unused-result",
                 "train_gpt2.c", "-lm", "-o", "train_gpt2"]
        p = subprocess.run(build, cwd=self.dir, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"building llm.c failed ({' '.join(build)} in {self.dir}):\n"
                               + p.stdout[-3000:])

    def run(self, threads):
        """(step times in ms, step 0's loss)."""
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        p = subprocess.run(["./train_gpt2"], cwd=self.dir, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        steps = re.findall(r"step (\d+): train loss ([0-9.naif]+) \(took ([0-9.]+) ms\)",
                           p.stdout)
        if p.returncode != 0 or not steps:
            raise RuntimeError(f"llm.c's train_gpt2 in {self.dir} failed (exit "
                               f"{p.returncode}):\n" + p.stdout[-3000:])
        return [float(ms) for _, _, ms in steps], float(steps[0][1])

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)
