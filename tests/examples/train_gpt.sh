#!/usr/bin/env bash
# train_gpt through mtrun, as a user runs it (docs/train_gpt.md). Tiny models, a few steps.
# usage: train_gpt.sh MTRUN TRAIN_GPT VARIANT
#   tp          tp 2 (2 ranks) and tp 4 (4 ranks) against 1 rank: losses of 5 f32 steps
#   dp_tp       dp 2 x tp 2 on 4 ranks with --batch halved (the same global batch) against 1 x 1
#   two_nodes   two mtrun as two nodes (2 ranks each, UCX over tcp on lo), tp inside each node
#               and dp across, against 1 x 1
#   two_nodes_c10d  the same, with the identical command line on both nodes (--rdzv-backend c10d
#               --rdzv-endpoint 127.0.0.1:PORT, node ranks by arrival), as torchrun runs
#   restart     two c10d nodes, dp 2 x tp 2, --max-restarts 1, checkpoints every 2 steps and
#               --resume auto; a rank chosen at random (seed printed; MT_TEST_SEED sets it) is
#               killed -9 at a random step: the job completes, and the restarted round's losses
#               and gradient norms equal an uninterrupted run's bit for bit
#   accum       dp 2 x tp 2, 2 micro-batches of 2 per dp rank, against 1 x 1 with 2 of 4
#   loss_falls  a small model on the default text: the first loss is about ln 256, the loss of
#               the last steps and the final held-out loss are clearly below it
#   errors      bad arguments: one clear message, a non-zero exit on every rank, no hang
#   tokens      a generated uint16 token file with --vocab 1000: dp 2 and tp 2 (2 ranks) against
#               1 rank, and the loss falls from about ln 1000 on tp 2
#   tokens_pad  vocabularies that tp does not divide (padded): 1000 on tp 4, 1001 on tp 2 and on
#               dp 2 x tp 2, against 1 rank
#   sequence_parallel  --sequence-parallel (re-gather) and --sequence-parallel=keep-gathered
#               against the same run without it: tp 2, tp 4 with --batch 1 (each rank's rows
#               start inside a sequence), dp 2 x tp 2, and that with 2 micro-batches (LayerNorm
#               gradients summed per micro-batch); the tp group's traffic differs only by the
#               re-gathered column-parallel inputs (re-gather) and the LayerNorm gradients'
#               all-reduce, per collective kind for keep-gathered; keep-gathered with full
#               recompute on dp 2 x tp 2; a seq that tp does not divide and an unknown mode
#               are refused
#   token_errors  a bad id, --data with --token-file, an odd-sized token file, --vocab below a
#               byte of --data, a vocabulary tp cannot split: one clear message each
#   recompute   --activation-checkpointing full and every:2 against none, dp 2 x tp 2 (4 ranks),
#               dp 1 x tp 2 and dp 2 with --param-dtype bf16: step losses and gradient norms bit for bit equal, and so the
#               parameters and optimizer state of the checkpoint saved after the last step (every
#               rank's file byte for byte); the activation peak lower with recompute
#   reshard     --reshard-after-forward 0 and 1 against the default, dp 2 x tp 2 (4 ranks) and
#               dp 2 with --param-dtype bf16: step losses and gradient norms bit for bit equal;
#               the dp group's all-gathers per step are 2L+1 by default (the root keeps its
#               parameters), L+1 with 0 and 2L+2 with 1 for L blocks; the reduce-scatters L+1
#               each
set -u
MTRUN=$1
PROG=$2
VARIANT=$3
TMP_PREFIX=train_gpt
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export MT_TIMEOUT_S=${MT_TIMEOUT_S:-60} MT_DEVICE=cpu

# f32: dp and tp sum the same terms in other orders (the batch split over dp ranks' gemms, the
# heads and vocabulary split over tp ranks, the reductions over ranks), which moves the losses by
# ~1e-7 relative; issue 6 asks for 1e-5.
TOL=1e-5
# 5 steps of a tiny model; lr large enough that the weights move visibly in 5 steps.
TINY=(--layers 2 --d-model 32 --heads 4 --seq 16 --steps 5 --lr 1e-2 --seed 7)

# make_tokens FILE COUNT VOCAB: COUNT little-endian uint16 ids below VOCAB, text-like: 60 "words"
# of 2 to 6 random ids (one holding VOCAB - 1, so that the last, padded tp slice is used) in
# random order, so that within a word the next id is determined and the loss can fall far below
# ln VOCAB.
make_tokens() {
    python3 - "$@" <<'EOF'
import random, struct, sys
path, count, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(5)
words = [[rng.randrange(vocab) for _ in range(rng.randint(2, 6))] for _ in range(60)]
words[0][0] = vocab - 1
ids = []
while len(ids) < count:
    ids.extend(rng.choice(words))
with open(path, "wb") as f:
    f.write(struct.pack("<%dH" % count, *ids[:count]))
EOF
}

# train NAME NPROC ARGS...: one mtrun; metrics in $TMP/NAME.jsonl, output in $TMP/NAME.out/.err
train() {
    local name=$1 np=$2
    shift 2
    if timeout 200 "$MTRUN" --standalone --nproc_per_node "$np" "$PROG" \
        --metrics "$TMP/$name.jsonl" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"; then
        pass "$name: trained on $np rank(s): $(grep -F 'step     4 ' "$TMP/$name.out" | head -n 1)"
    else
        fail "$name: training on $np rank(s) failed"
        show "$name"
    fi
}

# mesh_is NAME DP TP: NAME's run announced that mesh (the options took effect)
mesh_is() {
    check "$1 ran on the mesh dp $2 x tp $3" has_text "$TMP/$1.out" "mesh {\"dp\": $2, \"tp\": $3}"
}

# same REF NAME: NAME's step losses and gradient norms match REF's within TOL (relative), with as
# many steps; and REF's loss moved (a run that learned nothing would compare equal trivially)
same() {
    if python3 - "$TMP/$1.jsonl" "$TMP/$2.jsonl" "$TOL" "$2 vs $1" <<'EOF'; then
import json, sys
ref_path, got_path, tol, label = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
def steps(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return [r for r in rows if "loss" in r]
ref, got = steps(ref_path), steps(got_path)
if len(ref) != len(got) or not ref:
    sys.exit(f"{label}: {len(got)} steps against {len(ref)}")
worst = 0.0
for a, b in zip(ref, got):
    for key in ("loss", "grad_norm"):
        x, y = a[key], b[key]
        if x is None or y is None:
            sys.exit(f"{label}: step {a['step']} {key} is not a number")
        rel = abs(x - y) / max(abs(x), 1e-30)
        worst = max(worst, rel)
        if rel > tol:
            sys.exit(f"{label}: step {a['step']} {key} {y!r} against {x!r}: relative {rel:.2e} > {tol}")
if not ref[-1]["loss"] < ref[0]["loss"]:
    sys.exit(f"{label}: the reference loss did not move ({ref[0]['loss']} -> {ref[-1]['loss']})")
print(f"{label}: {len(ref)} steps, worst relative difference {worst:.2e} (tolerance {tol})")
EOF
        pass "$2 matches $1"
    else
        fail "$2 differs from $1"
    fi
}

# two_nodes NAME ARGS...: two mtrun (--nnodes 2, 2 ranks each) on 127.0.0.1, UCX over tcp
two_nodes() {
    local name=$1 port
    shift
    port=$(free_port)
    export UCX_TLS=tcp,self UCX_NET_DEVICES=lo
    start_node "${name}_node1" 1 "$port" "$PROG" "$@"
    start_node "$name" 0 "$port" "$PROG" --metrics "$TMP/$name.jsonl" "$@"
    expect_rc "$name" 0 200
    expect_rc "${name}_node1" 0 60
    unset UCX_TLS UCX_NET_DEVICES
}

# refused NAME NPROC TEXT ARGS...: mtrun exits non-zero in time; TEXT appears exactly once
# (one rank reports for all); no step ran
refused() {
    local name=$1 np=$2 text=$3
    shift 3
    start_bg "$name" "$MTRUN" --standalone --nproc_per_node "$np" "$PROG" "$@"
    expect_rc "$name" nonzero 60
    local n
    n=$(cat "$TMP/$name.out" "$TMP/$name.err" | grep -cF -- "$text")
    if [ "$n" -eq 1 ]; then
        pass "$name: one message: $(cat "$TMP/$name.out" "$TMP/$name.err" | grep -F -- "$text")"
    else
        fail "$name: '$text' appears $n times, expected once"
        show "$name"
    fi
    if grep -qF 'step ' "$TMP/$name.out"; then
        fail "$name: a training step ran"
    fi
}

# bitwise REF NAME: NAME's step losses and gradient norms are REF's exactly (metrics print f32
# values with 9 digits: equal text is equal bits), its last checkpoint's rank files are REF's byte
# for byte, and its activation peak (rank 0) is lower
bitwise() {
    if python3 - "$TMP/$1.jsonl" "$TMP/$2.jsonl" "$2 vs $1" <<'EOF'; then
import json, sys
ref_path, got_path, label = sys.argv[1:4]
def steps(path):
    return [json.loads(l) for l in open(path) if l.strip() and '"loss"' in l]
ref, got = steps(ref_path), steps(got_path)
if len(ref) != len(got) or not ref:
    sys.exit(f"{label}: {len(got)} steps against {len(ref)}")
for a, b in zip(ref, got):
    for key in ("loss", "grad_norm"):
        if a[key] != b[key]:
            sys.exit(f"{label}: step {a['step']} {key} {b[key]!r} against {a[key]!r}")
pa, pb = ref[-1]["peak_bytes"]["activations"], got[-1]["peak_bytes"]["activations"]
if not pb < pa:
    sys.exit(f"{label}: activation peak {pb} bytes, not below {pa} without recompute")
print(f"{label}: {len(ref)} steps bit for bit equal; activation peak {pb} bytes against {pa}")
EOF
        pass "$2: losses and gradient norms equal $1's bit for bit"
    else
        fail "$2: losses or gradient norms differ from $1's"
    fi
    local f n=0
    for f in "$TMP/$1.ckpt"/step-*/rank-*.bin; do
        [ -f "$f" ] || continue
        n=$((n + 1))
        cmp -s "$f" "$TMP/$2.ckpt/${f#"$TMP/$1.ckpt/"}" || fail "$2: ${f#"$TMP/$1.ckpt/"} differs"
    done
    if [ "$n" -gt 0 ]; then pass "$2: $n checkpoint rank files equal $1's byte for byte"
    else fail "$1: no checkpoint rank files"; fi
}

case $VARIANT in
tp)
    train ref 1 "${TINY[@]}" --batch 4
    for tp in 2 4; do
        train tp$tp $tp "${TINY[@]}" --batch 4 --tp $tp
        mesh_is tp$tp 1 $tp
        same ref tp$tp
    done
    ;;
dp_tp)
    train ref 1 "${TINY[@]}" --batch 4
    train dp2tp2 4 "${TINY[@]}" --batch 2 --dp 2 --tp 2
    mesh_is dp2tp2 2 2
    same ref dp2tp2
    ;;
two_nodes)
    train ref 1 "${TINY[@]}" --batch 4
    two_nodes nodes2 "${TINY[@]}" --batch 2 --dp 2 --tp 2
    mesh_is nodes2 2 2
    check "nodes2 ran on 2 nodes" has_text "$TMP/nodes2.out" "on 2 node(s), 2 rank(s) per node"
    same ref nodes2
    ;;
two_nodes_c10d)
    # torchrun's way: the identical command on both "nodes", node ranks by arrival (c10d)
    train ref 1 "${TINY[@]}" --batch 4
    port=$(free_port)
    export UCX_TLS=tcp,self UCX_NET_DEVICES=lo
    same_cmd=("$MTRUN" --nnodes 2 --nproc_per_node 2 --rdzv-backend c10d
              --rdzv-endpoint "127.0.0.1:$port" --rdzv-id c10d-test "$PROG" "${TINY[@]}"
              --batch 2 --dp 2 --tp 2 --metrics "$TMP/c10d.jsonl")
    start_bg c10d_a "${same_cmd[@]}"
    start_bg c10d_b "${same_cmd[@]}"
    expect_rc c10d_a 0 200
    expect_rc c10d_b 0 60
    unset UCX_TLS UCX_NET_DEVICES
    check "c10d: one of the two ran rank 0 on 2 nodes" \
        grep -q "on 2 node(s), 2 rank(s) per node" "$TMP/c10d_a.out" "$TMP/c10d_b.out"
    same ref c10d
    ;;
restart)
    seed=${MT_TEST_SEED:-$RANDOM}
    RANDOM=$seed
    steps=30
    kill_after=$((RANDOM % 12 + 2)) # steps done when the rank is killed: well before the end
    victim_node=$((RANDOM % 2)) victim_local=$((RANDOM % 2))
    echo "seed $seed: kill -9 local rank $victim_local of the node started $((victim_node + 1))" \
        "after $kill_after of $steps steps (MT_TEST_SEED=$seed repeats it)"
    export UCX_TLS=tcp,self UCX_NET_DEVICES=lo
    # restart_run NAME: both nodes with the identical command, checkpoints in $TMP/NAME.ckpt
    restart_run() {
        local port
        port=$(free_port)
        local cmd=("$MTRUN" --nnodes 2 --nproc_per_node 2 --rdzv-backend c10d
                   --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "restart-$1" --max-restarts 1
                   "$PROG" --layers 2 --d-model 64 --heads 4 --seq 32 --steps $steps --lr 1e-2
                   --seed 7 --batch 2 --dp 2 --tp 2 --save-every 2 --checkpoint-dir
                   "$TMP/$1.ckpt" --resume auto --metrics "$TMP/$1.jsonl")
        start_bg "${1}_a" "${cmd[@]}"
        start_bg "${1}_b" "${cmd[@]}"
    }
    restart_run ref
    expect_rc ref_a 0 200
    expect_rc ref_b 0 60
    restart_run killed
    nodes=("$PID_killed_a" "$PID_killed_b")
    names=(killed_a killed_b)
    for _ in $(seq 2000); do
        [ "$(cat "$TMP/killed.jsonl" 2>/dev/null | wc -l)" -ge "$kill_after" ] && break
        sleep 0.01
    done
    victim=$(pgrep -P "${nodes[$victim_node]}" | sort -n | sed -n "$((victim_local + 1))p")
    victim_rank=$(tr '\0' '\n' <"/proc/$victim/environ" 2>/dev/null | sed -n 's/^RANK=//p')
    check "rank $victim_rank (pid $victim) killed -9 after $(wc -l <"$TMP/killed.jsonl") steps" \
        kill -9 "$victim"
    expect_rc killed_a 0 200
    expect_rc killed_b 0 60
    unset UCX_TLS UCX_NET_DEVICES
    node=${names[$victim_node]}
    check "$node named the killed rank" grep -qE \
        "^mtrun: rank $victim_rank \(node [01], local rank $victim_local\) was killed by signal 9 \(SIGKILL\); stopping the job$" \
        "$TMP/$node.err"
    for n in killed_a killed_b; do
        check "$n restarted its ranks once" test \
            "$(grep -c '^mtrun: restarting every rank (restart 1 of 1, --max_restarts) after: ' "$TMP/$n.err")" = 1
    done
    check "rank 0 resumed from the last checkpoint" grep -qE \
        "^\[rank0\]:train_gpt: resumed from .*/step-0*[0-9]+ at step [0-9]+ " \
        "$TMP/killed_a.out" "$TMP/killed_b.out"
    if python3 - "$TMP/ref.jsonl" "$TMP/killed.jsonl" "$steps" <<'EOF'; then
import json, sys
def steps(path):
    # the numbers as printed (9 significant digits: every bit of an f32)
    rows = {}
    for line in open(path):
        if '"loss"' in line:
            r = json.loads(line, parse_float=str)
            rows[r["step"]] = (r["loss"], r["grad_norm"])
    return rows
ref, got, total = steps(sys.argv[1]), steps(sys.argv[2]), int(sys.argv[3])
if sorted(ref) != list(range(total)):
    sys.exit(f"the uninterrupted run has steps {sorted(ref)}")
first = min(got) if got else total
if not got or sorted(got) != list(range(first, total)) or first == 0:
    sys.exit(f"the restarted round has steps {sorted(got)}, expected a resumed tail ending at {total - 1}")
for s in sorted(got):
    if got[s] != ref[s]:
        sys.exit(f"step {s}: loss, grad_norm {got[s]} against {ref[s]} uninterrupted")
print(f"steps {first}..{total - 1} of the restarted round equal the uninterrupted run's bit for bit")
EOF
        pass "the restarted job's losses equal the uninterrupted run's"
    else
        fail "the restarted job's losses differ from the uninterrupted run's"
        show killed_a
        show killed_b
    fi
    ;;
accum)
    # 2 micro-batches of 2 sequences per dp rank (gradient sync on the last only) against 1 x 1
    # with 2 micro-batches of 4: the same sequences, the same gradients.
    train ref 1 "${TINY[@]}" --batch 4 --grad-accum 2
    train dp2tp2 4 "${TINY[@]}" --batch 2 --grad-accum 2 --dp 2 --tp 2
    same ref dp2tp2
    ;;
loss_falls)
    # ln 256 = 5.545 is the loss of a uniform guess over bytes; a model that has learnt only the
    # byte frequencies of English text is near 3.0 (their entropy, ~4.3 bits). The run must start
    # near ln 256 (within 0.5), end with a training loss (mean of the last 10 steps) below
    # THRESHOLD and a held-out loss below VAL_THRESHOLD (the held-out 10% is the end of the GPL,
    # unlike the rest, so it stays higher). Measured: 5.53 -> 2.35 (training), 5.51 -> 2.88
    # (held-out), in about 10 s on 2 cores.
    THRESHOLD=3.0
    VAL_THRESHOLD=3.5
    train falls 2 --tp 2 --layers 2 --d-model 64 --heads 4 --seq 64 --batch 8 --steps 300 \
        --lr 1e-3 --warmup 20 --eval-every 150
    python3 - "$TMP/falls.jsonl" "$THRESHOLD" "$VAL_THRESHOLD" <<'EOF' && pass "the loss falls" || fail "the loss does not fall below the thresholds"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
threshold, val_threshold = float(sys.argv[2]), float(sys.argv[3])
steps = [r["loss"] for r in rows if "loss" in r]
evals = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
first, last = steps[0], sum(steps[-10:]) / 10
print(f"first loss {first:.4f} (ln 256 = {math.log(256):.4f}), mean of the last 10 {last:.4f} "
      f"(threshold {threshold}); held-out {evals} (threshold {val_threshold})")
ok = len(steps) == 300 and abs(first - math.log(256)) < 0.5 and last < threshold
ok = ok and [s for s, _ in evals] == [0, 150, 300] and evals[-1][1] < val_threshold
sys.exit(0 if ok else 1)
EOF
    grep -F 'loss curve' "$TMP/falls.out" || fail "no loss curve summary"
    ;;
recompute)
    # NAME NPROC ARGS: dp 2 x tp 2; tp 2; dp 2 with bf16 parameters (the recompute re-reads them)
    for run in "dptp 4 --dp 2 --tp 2 --batch 2" "tp 2 --tp 2 --batch 4" \
        "bf16 2 --dp 2 --batch 2 --param-dtype bf16"; do
        read -ra args <<<"$run"
        for ac in none full every:2; do
            name=${args[0]}_${ac/:/}
            train "$name" "${args[1]}" "${TINY[@]}" --layers 3 "${args[@]:2}" --save-every 5 \
                --checkpoint-dir "$TMP/$name.ckpt" --activation-checkpointing "$ac"
        done
        check "${args[0]}_full: 3 of 3 blocks recompute" has_text "$TMP/${args[0]}_full.out" \
            "3 of 3 blocks recompute"
        check "${args[0]}_every2: 2 of 3 blocks recompute" has_text "$TMP/${args[0]}_every2.out" \
            "2 of 3 blocks recompute"
        bitwise "${args[0]}_none" "${args[0]}_full"
        bitwise "${args[0]}_none" "${args[0]}_every2"
    done
    ;;
reshard)
    # NAME NPROC ARGS: dp 2 x tp 2 (3 blocks), dp 2 with bf16 parameters (gathered in bf16)
    for run in "dptp 4 --dp 2 --tp 2 --batch 2" "bf16 2 --dp 2 --batch 2 --param-dtype bf16"; do
        read -ra args <<<"$run"
        for r in default 0 1; do
            opt=()
            [ "$r" = default ] || opt=(--reshard-after-forward "$r")
            train "${args[0]}_$r" "${args[1]}" "${TINY[@]}" --layers 3 "${args[@]:2}" "${opt[@]}"
        done
        check "${args[0]}_0 announced" has_text "$TMP/${args[0]}_0.out" "reshard after forward none"
        check "${args[0]}_1 announced" has_text "$TMP/${args[0]}_1.out" \
            "reshard after forward all units"
        # Losses and gradient norms: same() with no tolerance (equal text is equal bits).
        for r in 0 1; do TOL=0 same "${args[0]}_default" "${args[0]}_$r"; done
        if python3 - "$TMP" "${args[0]}" 3 <<'EOF'; then
import re, sys
tmp, name, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
def traffic(r):
    line = [l for l in open(f"{tmp}/{name}_{r}.out") if "dp traffic" in l][-1]
    return {k: int(n) for k, n in re.findall(r"(\w+) (\d+) calls", line)}
for r, gathers in (("default", 2 * layers + 1), ("0", layers + 1), ("1", 2 * layers + 2)):
    t = traffic(r)
    if t["all_gather"] != gathers or t["reduce_scatter"] != layers + 1:
        sys.exit(f"{name}_{r}: dp traffic {t}, expected {gathers} all-gathers and "
                 f"{layers + 1} reduce-scatters")
    print(f"{name}_{r}: dp traffic {t}")
EOF
            pass "${args[0]}: each mode's all-gathers and reduce-scatters per step"
        else
            fail "${args[0]}: resharding's collectives"
        fi
    done
    ;;
errors)
    small=$TMP/small.txt
    head -c 50 /usr/share/common-licenses/GPL-3 >"$small" 2>/dev/null || printf '%050d' 0 >"$small"
    refused world 4 "dp 3 x tp 2 = 6 != world size 4" --dp 3 --tp 2
    refused tp_world 4 "tp 3 does not divide the world size 4" --tp 3
    refused heads 2 "heads 3 not divisible by tp 2" --tp 2 --heads 3 --d-model 48
    refused d_model 2 "d-model 30 not divisible by heads 4" --d-model 30
    refused no_data 2 "cannot open data file '$TMP/none.txt'" --data "$TMP/none.txt"
    refused short_data 2 "seq 64 is longer than the data" --data "$small" --seq 64
    refused short_val 2 "seq 40 is longer than the held-out data" --data "$small" --seq 40 \
        --eval-every 1
    refused metrics 2 "cannot write metrics file '$TMP/none/m.jsonl'" --metrics "$TMP/none/m.jsonl"
    refused option 2 "unknown option '--bogus'" --bogus 1
    refused layers 2 "--layers '0' must be an integer >= 1" --layers 0
    refused dtype 2 "--param-dtype 'f16' must be f32 or bf16" --param-dtype f16
    refused reshard 2 "--reshard-after-forward '2' must be 0 or 1" --reshard-after-forward 2
    refused mapped 2 "--mapped-gather 'yes' must be 0 or 1" --mapped-gather yes
    refused device 2 "--device 'tpu' must be cpu, cuda or auto" --device tpu
    refused value 2 "--steps needs a value" --steps
    refused ac 2 "--activation-checkpointing 'some' must be none, full or every:K" \
        --activation-checkpointing some
    refused ac_k 2 "--activation-checkpointing 'every:0': K in every:K must be an integer >= 1" \
        --activation-checkpointing every:0
    refused ac_junk 2 "--activation-checkpointing 'every:2x': K in every:K must be an integer" \
        --activation-checkpointing every:2x
    # Without a launcher, each rank exits non-zero by itself (nobody stops it).
    port=$(free_port)
    for r in 0 1; do
        start_bg hand$r env RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
            MT_RDZV_ID="hand-$port" "$PROG" --dp 3
    done
    for r in 0 1; do expect_rc hand$r nonzero 60; done
    check "rank 0 named the shape" has_text "$TMP/hand0.err" "dp 3 x tp 1 = 3 != world size 2"
    ;;
tokens)
    make_tokens "$TMP/t1000.bin" 20000 1000
    TOK=(--vocab 1000 --token-file "$TMP/t1000.bin")
    train ref 1 "${TINY[@]}" "${TOK[@]}" --batch 4
    check "ref read the token file" has_text "$TMP/ref.out" \
        "token file $TMP/t1000.bin: 20000 tokens, 18000 for training, 2000 held out"
    train dp2 2 "${TINY[@]}" "${TOK[@]}" --batch 2 --dp 2
    mesh_is dp2 2 1
    same ref dp2
    train tp2 2 "${TINY[@]}" "${TOK[@]}" --batch 4 --tp 2
    mesh_is tp2 1 2
    same ref tp2
    # ln 1000 = 6.908 is a uniform guess; the words make the next id certain inside a word, so a
    # model that learnt them is near ln 60 / 4 (the choice of the next word, once per ~4 ids).
    # Measured: 6.92 -> 1.2 (training, mean of the last 10 of 150 steps), 6.93 -> 1.25 (held out),
    # in about 1 s.
    train falls 2 --tp 2 --layers 2 --d-model 32 --heads 4 --seq 16 --batch 8 --steps 150 \
        --lr 1e-2 --warmup 10 --eval-every 75 "${TOK[@]}"
    python3 - "$TMP/falls.jsonl" <<'EOF' && pass "the loss falls on tokens" || fail "the loss does not fall on tokens"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r["loss"] for r in rows if "loss" in r]
evals = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
first, last = steps[0], sum(steps[-10:]) / 10
print(f"first loss {first:.4f} (ln 1000 = {math.log(1000):.4f}), mean of the last 10 {last:.4f} "
      f"(threshold 3.0); held-out {evals} (threshold 3.0)")
ok = len(steps) == 150 and abs(first - math.log(1000)) < 0.5 and last < 3.0
ok = ok and [s for s, _ in evals] == [0, 75, 150] and evals[-1][1] < 3.0
sys.exit(0 if ok else 1)
EOF
    check "the loss curve names ln 1000" has_text "$TMP/falls.out" "(ln 1000 = 6.9078)"
    ;;
tokens_pad)
    # The model pads the vocabulary to a multiple of tp: 1000 on tp 4 (no padding, 250 each), 1001
    # on tp 2 (501 rows each, the second's last one padding) and on dp 2 x tp 2 (the padded
    # embedding sharded by FSDP too).
    make_tokens "$TMP/t1000.bin" 20000 1000
    make_tokens "$TMP/t1001.bin" 20000 1001
    train ref1000 1 "${TINY[@]}" --vocab 1000 --token-file "$TMP/t1000.bin" --batch 4
    train tp4 4 "${TINY[@]}" --vocab 1000 --token-file "$TMP/t1000.bin" --batch 4 --tp 4
    same ref1000 tp4
    train ref1001 1 "${TINY[@]}" --vocab 1001 --token-file "$TMP/t1001.bin" --batch 4
    train tp2 2 "${TINY[@]}" --vocab 1001 --token-file "$TMP/t1001.bin" --batch 4 --tp 2
    same ref1001 tp2
    train dp2tp2 4 "${TINY[@]}" --vocab 1001 --token-file "$TMP/t1001.bin" --batch 2 --dp 2 \
        --tp 2
    same ref1001 dp2tp2
    ;;
token_errors)
    make_tokens "$TMP/ok.bin" 2000 1000
    # id 1000 (one past --vocab 1000) at position 123, byte offset 246
    cp "$TMP/ok.bin" "$TMP/bad.bin"
    printf '\xe8\x03' | dd of="$TMP/bad.bin" bs=1 seek=246 conv=notrunc 2>/dev/null
    refused bad_id 2 "token file '$TMP/bad.bin': id 1000 at position 123 (byte offset 246) is not below --vocab 1000" \
        --vocab 1000 --token-file "$TMP/bad.bin"
    refused both 2 "--data '$TMP/x.txt' and --token-file '$TMP/ok.bin' are exclusive" \
        --token-file "$TMP/ok.bin" --vocab 1000 --data "$TMP/x.txt"
    head -c 1001 "$TMP/ok.bin" >"$TMP/odd.bin"
    refused odd 2 "token file '$TMP/odd.bin' has 1001 bytes: not a whole number of 2-byte" \
        --vocab 1000 --token-file "$TMP/odd.bin"
    refused no_file 2 "cannot open token file '$TMP/none.bin'" --token-file "$TMP/none.bin"
    head -c 60 "$TMP/ok.bin" >"$TMP/short.bin"
    refused short 2 "seq 64 is longer than the data: a sequence needs 65 tokens but the training part of '$TMP/short.bin' (90% of 30 tokens) has 27" \
        --vocab 1000 --token-file "$TMP/short.bin" --seq 64
    # --data's ids are its bytes: 'h' (104) at offset 3 is not below --vocab 100.
    printf '\001\002\003hello' >"$TMP/text.txt"
    refused small_vocab 2 "--vocab 100 is too small for data file '$TMP/text.txt': its bytes are the token ids and byte 3 is 104" \
        --vocab 100 --data "$TMP/text.txt"
    refused zero_vocab 2 "--vocab '0' must be an integer >= 1" --vocab 0
    # vocab 5 over tp 4: slices of 2 rows, the last would hold only padding (ids 6 and 7)
    make_tokens "$TMP/v5.bin" 2000 5
    refused vocab_tp 4 "vocab 5 cannot be split over tp 4: padded to 8" --vocab 5 --tp 4 \
        --token-file "$TMP/v5.bin"
    ;;
sequence_parallel)
    # name ranks batch args: the run without sequence parallelism, and with it in each mode
    # (re-gather, keep-gathered), compared
    for spec in "tp2 2 4 --tp 2" "tp4 4 1 --tp 4" "dp2tp2 4 2 --dp 2 --tp 2" \
        "dp2tp2accum 4 1 --dp 2 --tp 2 --grad-accum 2"; do
        set -- $spec
        name=$1 np=$2 batch=$3
        shift 3
        train "$name" "$np" "${TINY[@]}" --batch "$batch" "$@"
        for mode in regather keep-gathered; do
            run=${name}_sp
            [ "$mode" = regather ] || run=${name}_spk
            opt=--sequence-parallel
            [ "$mode" = regather ] || opt=--sequence-parallel=$mode
            train "$run" "$np" "${TINY[@]}" --batch "$batch" "$@" "$opt"
            check "$run said so" has_text "$TMP/$run.out" "sequence parallelism on"
            same "$name" "$run"
            # Traffic sent per rank by ring collectives, from rank 0's tp-group counters: an
            # all-reduce of M bytes sends 2 (p-1)/p M, an all-gather or reduce-scatter (p-1)/p M.
            # Sequence parallelism replaces each activation all-reduce by a reduce-scatter and an
            # all-gather (the same) and adds the LayerNorm gradients' all-reduce ((4 x layers +
            # 2) x C); re-gathering adds the column-parallel inputs gathered again in backward
            # (2 per layer and the head's, N x C each), keep-gathered nothing more. Besides the
            # total, per kind: keep-gathered's all-gathers and reduce-scatters move the bytes of
            # the run without it's activation all-reduces, and its all-reduces those of the
            # run without it less those activation all-reduces plus the LayerNorm gradients.
            if python3 - "$TMP/$name.out" "$TMP/$run.out" "$np" "$batch" "$name" "$mode" <<'EOF'; then
import re, sys
layers, C, seq = 2, 32, 16  # TINY
dp = 2 if sys.argv[5].startswith("dp2") else 1
accum = 2 if sys.argv[5].endswith("accum") else 1  # micro-batches: each pays the extras
mode = sys.argv[6]
p = int(sys.argv[3]) // dp
N = int(sys.argv[4]) * seq
def traffic(path):
    line = [l for l in open(path) if "tp traffic" in l][-1]
    return {k: (int(c), int(b)) for k, c, b in re.findall(r"(\w+) (\d+) calls (\d+) B", line)}
def ring_times_p(t):  # p x bytes sent per rank, an integer
    return (p - 1) * (2 * t["all_reduce"][1] + t["all_gather"][1] + t["reduce_scatter"][1])
base, sp = traffic(sys.argv[1]), traffic(sys.argv[2])
ln = accum * 2 * (p - 1) * (4 * layers + 2) * C * 4
regather = accum * (p - 1) * (2 * layers + 1) * N * C * 4
extra = ln + (regather if mode == "regather" else 0)
got = ring_times_p(sp) - ring_times_p(base)
print(f"{sys.argv[5]} {mode}: per rank per step {ring_times_p(base) / p:.0f} B without, "
      f"{ring_times_p(sp) / p:.0f} B with sequence parallelism (+{extra / p:.0f} expected)")
if base["all_gather"][1] or base["reduce_scatter"][1] or got != extra:
    sys.exit(f"traffic {base} -> {sp}: difference {got / p} B, expected {extra / p} B")
if mode == "keep-gathered":
    # The activation all-reduces of the run without: 4 x layers + 2 per micro-batch of N x C
    # (embedding, 2 row-parallel forwards and 2 column-parallel backwards a layer, the head's).
    act_calls, act_bytes = accum * (4 * layers + 2), accum * (4 * layers + 2) * N * C * 4
    ln_calls, ln_bytes = accum * (layers + 1), accum * (4 * layers + 2) * C * 4
    want = {"all_gather": (act_calls, act_bytes), "reduce_scatter": (act_calls, act_bytes),
            "all_reduce": (base["all_reduce"][0] - act_calls + ln_calls,
                           base["all_reduce"][1] - act_bytes + ln_bytes)}
    for k, v in want.items():
        if sp[k] != v:
            sys.exit(f"{k}: {sp[k][0]} calls {sp[k][1]} B, expected {v[0]} calls {v[1]} B "
                     f"(without: {base})")
EOF
                if [ "$mode" = regather ]; then
                    pass "$run: tp traffic differs by the re-gathers and LayerNorm gradients only"
                else
                    pass "$run: tp traffic differs by the LayerNorm gradients only, per kind"
                fi
            else
                fail "$run: tp traffic"
            fi
        done
    done
    # Recompute with the inputs kept gathered: the discard frees them, the re-run gathers them
    # again; the losses stay those without sequence parallelism.
    train dp2tp2_spk_ac 4 "${TINY[@]}" --batch 2 --dp 2 --tp 2 \
        --sequence-parallel=keep-gathered --activation-checkpointing full
    same dp2tp2 dp2tp2_spk_ac
    refused sp_seq 4 "sequence parallelism: seq 10 not divisible by tp 4" "${TINY[@]}" \
        --seq 10 --tp 4 --sequence-parallel
    refused sp_mode 2 "--sequence-parallel 'keep': the mode is regather (the default) or keep-gathered" \
        "${TINY[@]}" --tp 2 --sequence-parallel=keep
    ;;
*)
    fail "unknown variant '$VARIANT'"
    ;;
esac
finish
