"""Step time of meshtrain's train_gpt against PyTorch FSDP2 (+ TP) on gloo, same model and batch.

Run by bench/compare_pytorch.sh with the venv's python (which has torch). For each
configuration (ranks as dp, or dp x tp) it alternates runs, meshtrain then PyTorch, --rounds
times, so that the machine's other load hits both alike; each run trains --steps steps and the
steps from --warmup on are pooled per side. It prints the median step time of each side, their
ratio (meshtrain / PyTorch; issue 20's target is <= 0.8), the first step's loss of each (both
near ln 256 = 5.55 from the same init distribution) and the parameter counts, which must be
equal: they show that the two models have the same shape. Exit status 1 when they are not or
a run fails; the ratio itself decides nothing here (a comparison, not a test).

With --llmc DIR (a checkout of github.com/karpathy/llm.c), the 1-rank configuration also runs
llm.c's CPU trainer on the same model shape and batch, OpenMP threads = the cores, third in each
round (bench/compare_llmc.py says how it is built and fed).
"""

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_config(text):
    """'2' -> (dp 2, tp 1); '2x2' -> (dp 2, tp 2)."""
    m = re.fullmatch(r"(\d+)(?:x(\d+))?", text)
    if not m:
        raise argparse.ArgumentTypeError(f"configuration '{text}': expected N or DPxTP")
    return int(m.group(1)), int(m.group(2) or 1)


def config_name(dp, tp):
    if tp == 1:
        return "1 rank" if dp == 1 else f"dp {dp}"
    return f"dp {dp} x tp {tp}"


def run(cmd, env=None):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        fd, path = tempfile.mkstemp(prefix="compare_pytorch.", suffix=".log")
        with os.fdopen(fd, "w") as f:
            f.write(p.stdout)
        sys.stderr.write(p.stdout[-4000:])
        raise RuntimeError(f"exit {p.returncode}: {' '.join(cmd)} (its whole output: {path})")
    return p.stdout


def model_args(a):
    return ["--layers", str(a.layers), "--d-model", str(a.d_model), "--heads", str(a.heads),
            "--seq", str(a.seq), "--steps", str(a.steps), "--lr", str(a.lr), "--seed", str(a.seed)]


def run_meshtrain(a, dp, tp):
    """One train_gpt run through mtrun: (step times in ms, step 0's loss, parameter count)."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        out = run([a.mtrun, "--standalone", "--nproc_per_node", str(dp * tp), a.train_gpt,
                   "--dp", str(dp), "--tp", str(tp), "--batch", str(a.global_batch // dp),
                   "--metrics", metrics] + model_args(a))
        steps = [json.loads(line) for line in open(metrics) if '"loss"' in line]
    m = re.search(r"(\d+) parameters", out)
    if not m:
        raise RuntimeError("train_gpt printed no parameter count")
    return [s["step_ms"] for s in steps], steps[0]["loss"], int(m.group(1))


def run_torch(a, dp, tp):
    """One PyTorch run through torchrun: (step times in ms, step 0's loss, parameter count)."""
    ranks = dp * tp
    threads = max(1, a.cores // ranks)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(ranks), os.path.join(HERE, "compare_pytorch_gpt.py"),
               "--dp", str(dp), "--tp", str(tp), "--batch", str(a.global_batch // dp),
               "--threads", str(threads)] + model_args(a), env=env)
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    steps = [l for l in lines if "step_ms" in l]
    params = next(l["params"] for l in lines if "params" in l)
    return [s["step_ms"] for s in steps], steps[0]["loss"], params


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build", help="meshtrain's build directory (build)")
    ap.add_argument("--configs", default="1,2,4,2x2",
                    help="comma-separated: N ranks as dp, or DPxTP (1,2,4,2x2)")
    ap.add_argument("--rounds", type=int, default=2, help="alternated run pairs per config (2)")
    ap.add_argument("--steps", type=int, default=6, help="steps per run (6)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps of a run not timed (2)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=4, help="sequences per step, all ranks")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--llmc", metavar="DIR",
                    help="a checkout of karpathy/llm.c: also time its train_gpt2.c at 1 rank")
    a = ap.parse_args()
    if a.steps <= a.warmup:
        ap.error(f"--steps {a.steps} leaves no timed step after --warmup {a.warmup}")
    try:
        configs = [parse_config(c) for c in a.configs.split(",")]
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    for dp, tp in configs:
        if dp < 1 or tp < 1:
            ap.error(f"configuration {dp}x{tp}: dp and tp must be at least 1")
        if a.global_batch % dp:
            ap.error(f"global batch {a.global_batch} is not divisible by dp {dp}")
        if a.heads % tp:
            ap.error(f"{a.heads} heads are not divisible by tp {tp}")
    a.mtrun = os.path.join(a.build, "bin", "mtrun")
    a.train_gpt = os.path.join(a.build, "bin", "train_gpt")
    for exe in (a.mtrun, a.train_gpt):
        if not os.access(exe, os.X_OK):
            ap.error(f"{exe} not found: build meshtrain first (scripts/build)")
    if a.llmc and not (os.path.isfile(os.path.join(a.llmc, "train_gpt2.c"))
                       and os.path.isdir(os.path.join(a.llmc, "llmc"))):
        ap.error(f"--llmc {a.llmc}: no train_gpt2.c and llmc/ there (a checkout of "
                 "github.com/karpathy/llm.c)")
    a.cores = len(os.sched_getaffinity(0))

    import torch  # noqa: F401 (the version goes into the header)
    print(f"GPT {a.layers} x {a.d_model}, {a.heads} heads, seq {a.seq}, global batch "
          f"{a.global_batch}, f32; {a.rounds} alternated rounds of {a.steps} steps per side, "
          f"median of steps {a.warmup}..{a.steps - 1}; torch {torch.__version__}, "
          f"{a.cores} cores, torch threads per rank = cores / ranks (at least 1); "
          f"load average at start {load()}", flush=True)
    llmc = None
    if a.llmc and (1, 1) in configs:
        from compare_llmc import LlmC
        llmc = LlmC(a.llmc, a.layers, a.d_model, a.heads, a.seq, a.global_batch, a.steps,
                    seed=a.seed)
        print(f"llm.c: {a.llmc} built in {llmc.dir}, {llmc.params} parameters, OpenMP "
              f"threads {a.cores}", flush=True)
    rows, ok = [], True
    try:
        for dp, tp in configs:
            mt_ms, pt_ms, lc_ms = [], [], []
            lc_loss, lc_params = None, None
            for r in range(a.rounds):
                ms, mt_loss, mt_params = run_meshtrain(a, dp, tp)
                mt_round = ms[a.warmup:]
                ms, pt_loss, pt_params = run_torch(a, dp, tp)
                pt_round = ms[a.warmup:]
                mt_ms += mt_round
                pt_ms += pt_round
                extra = ""
                if llmc and (dp, tp) == (1, 1):
                    ms, lc_loss = llmc.run(a.cores)
                    lc_params = llmc.params
                    lc_ms += ms[a.warmup:]
                    extra = f", llm.c {statistics.median(ms[a.warmup:]):.0f} ms"
                print(f"  {config_name(dp, tp)} round {r}: meshtrain "
                      f"{statistics.median(mt_round):.0f} ms, PyTorch "
                      f"{statistics.median(pt_round):.0f} ms{extra} (this round's medians); "
                      f"load average {load()}", flush=True)
            mt, pt = statistics.median(mt_ms), statistics.median(pt_ms)
            lc = statistics.median(lc_ms) if lc_ms else None
            if mt_params != pt_params or (lc_params is not None and lc_params != mt_params):
                ok = False
            rows.append((config_name(dp, tp), mt, pt, lc, mt_loss, pt_loss, lc_loss,
                         mt_params, pt_params, lc_params))
    finally:
        if llmc:
            llmc.close()
    print(f"load average at end {load()}\n")
    with_lc = llmc is not None
    print("| configuration | meshtrain step | PyTorch step | ratio (target <= 0.8) | "
          + ("llm.c step (OpenMP) | " if with_lc else "")
          + "step 0 loss mt / torch" + (" / llm.c" if with_lc else "")
          + " | parameters mt / torch" + (" / llm.c" if with_lc else "") + " |")
    print("|---|---|---|---|" + ("---|" if with_lc else "") + "---|---|")
    for name, mt, pt, lc, ml, pl, ll, mp, pp, lp in rows:
        same = mp == pp and (lp is None or lp == mp)
        lc_cells = ""
        if with_lc:
            lc_cells = (f"{lc / 1e3:.2f} s | " if lc is not None else "| ")
        losses = f"{ml:.3f} / {pl:.3f}" + (f" / {ll:.3f}" if ll is not None else "")
        params = f"{mp} / {pp}" + (f" / {lp}" if lp is not None else "")
        print(f"| {name} | {mt / 1e3:.2f} s | {pt / 1e3:.2f} s | {mt / pt:.2f} "
              f"{'(met)' if mt / pt <= 0.8 else '(not met)'} | {lc_cells}{losses} | "
              f"{params}{'' if same else ' MISMATCH'} |")
    print(f"\n(ln {256} = {math.log(256):.3f}: both first losses should be near it)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
