/* train_gpt: a GPT (byte-level by default) trained with tensor parallelism inside a host and FSDP
 * across hosts, on a {"dp", "tp"} DeviceMesh. What a user runs, and what a user copies from.
 *
 *   mtrun --standalone --nproc_per_node 4 train_gpt --dp 2 --tp 2 --steps 300
 *
 * Every rank builds the same model (initialised on the global tensors from --seed, so any dp x tp
 * starts from the same weights), shards each block and then the root over "dp", creates AdamW on
 * its shards and trains on its dp rank's sequences, drawn from the data file's bytes (or from a
 * token file's uint16 ids, with --token-file and --vocab). Rank 0 prints the mesh and topology
 * at start, one line per step, and a loss-curve summary at the end.
 * docs/train_gpt.md describes every option, the data, the schedule and the --metrics format.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, setenv */

#include <meshtrain/meshtrain.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROG "train_gpt"
#define DEFAULT_DATA "/usr/share/common-licenses/GPL-3"
#define EVAL_MICRO_BATCHES 4 /* micro-batches of --batch sequences per dp rank per evaluation */
#define ERR_CAP 512

typedef struct options {
    int dp, tp; /* dp 0: world / tp */
    int layers, d_model, heads, seq, batch, grad_accum, steps, warmup, eval_every;
    int vocab;
    float lr, weight_decay, clip;
    uint64_t seed;
    mt_dtype param_dtype, reduce_dtype;
    bool prefetch;
    int reshard_after_forward; /* --reshard-after-forward 0|1; -1: FSDP's default */
    bool mapped_gather;        /* --mapped-gather 0|1 (mt_fsdp_options.mapped_gather) */
    mt_offload offload;  /* --offload none|optimizer|full */
    float offload_ratio; /* --offload-ratio: the fraction of units offloaded (1) */
    bool offload_overlap; /* --offload-overlap: host AdamW step during the backward */
    bool predict_only; /* --predict-memory: print the memory prediction and stop */
    int recompute_every; /* --activation-checkpointing: 0 none, K: blocks 0, K, 2K, ... */
    int sequence_parallel; /* --sequence-parallel[=MODE]: an mt_gpt_sp_mode */
    const char *device, *metrics; /* device NULL: MT_DEVICE or auto */
    const char *data;       /* --data: bytes as tokens (DEFAULT_DATA unless a token file) */
    const char *token_file; /* --token-file: little-endian uint16 ids; NULL: --data */
    bool data_given;        /* --data was on the command line (exclusive with --token-file) */
    float peak_tflops; /* per device, for MFU; 0 = from the GPU model */
    /* Checkpoints: where to save, how often, how many to keep, and what to resume from. */
    const char *ckpt_dir, *resume; /* resume: NULL, "auto" or a path */
    int save_every, keep;
    unsigned model_given; /* MODEL_* bits of the model options given on the command line */
    char resume_path[4096]; /* the checkpoint to resume from ("" to start fresh) */
    bool resume_optimizer;  /* it was saved by train_gpt (with the optimizer), not imported */
    char resume_note[512];  /* schedule options given that differ from the checkpoint's */
} options;

/* The model's shape options: a resumed run takes them from the checkpoint. */
enum { MODEL_LAYERS = 1, MODEL_D_MODEL = 2, MODEL_HEADS = 4, MODEL_SEQ = 8, MODEL_VOCAB = 16 };
/* The schedule's options: a resumed run takes those not given from the checkpoint. */
enum { RUN_SEED = 32, RUN_LR = 64, RUN_WARMUP = 128, RUN_WEIGHT_DECAY = 256, RUN_CLIP = 512 };
#define RUN_EXTRA "train_gpt.run" /* JSON text: seed, lr, warmup, weight decay, clip */
#define RUN_FORMAT                                                                                 \
    "{\"seed\": %llu, \"lr\": %.9g, \"warmup\": %d, \"weight_decay\": %.9g, \"clip\": %.9g}"
#define RUN_SCAN "{\"seed\": %llu, \"lr\": %g, \"warmup\": %d, \"weight_decay\": %g, \"clip\": %g}"
#define CONFIG_EXTRA "model_config" /* JSON text: the GPT-2 configuration (docs/checkpoint.md) */
#define STEP_EXTRA "train_gpt.step" /* int64: optimizer steps taken */

/* The data: the token ids of the file (its bytes, or its little-endian uint16 values); the last
 * 10% is held out for evaluation. Bytes are widened to uint16 too, so that one fill_batch serves
 * both inputs and byte runs draw exactly the ids they always did. */
typedef struct dataset {
    uint16_t *ids;
    size_t size, train_len, val_len; /* in tokens; train: [0, train_len); val: [train_len, size) */
    const char *path, *unit;         /* the file read; "bytes" or "tokens", for messages */
} dataset;

#define MEM_FIELDS 6 /* the memory figures: mem_names */

/* Everything one training run holds. */
typedef struct trainer {
    const options *opt;
    mt_runtime *rt;
    dataset data;
    FILE *metrics; /* rank 0 only */
    mt_mesh *mesh;
    mt_group *dp_group, *tp_group, *world;
    mt_comm_counters tp_traffic; /* what this rank's tp group moved in the last step */
    mt_comm_counters dp_traffic; /* and its dp group (FSDP's gathers and reduce-scatters, the
                                  * clip's all-reduce; not the loss's, after the step) */
    mt_gpt *gpt;
    mt_adamw *adam;
    int rank, world_size, dp_rank;
    int *tokens;        /* batch x (seq + 1) */
    float *step_losses; /* rank 0: every step's loss, for the closing summary */
    double flops_per_token; /* training FLOPs per token: 6 x params + attention */
    double peak_flops;      /* all ranks' bf16 dense peak, FLOP/s; 0 = unknown (no MFU) */
    bool predicted_fits;    /* the predicted peaks fit the device's capacity (or it has none) */
    char peak_source[128];  /* where the peak came from, for the summary */
    double timed_ms;        /* steps after the first: time and tokens, for the throughput */
    double timed_tokens;
    int first_step;         /* 0, or the step a resumed run starts at */
    char config_json[256];  /* the model configuration saved with every checkpoint */
    char run_json[256];     /* and the schedule's options */
    int64_t steps_done;     /* saved with every checkpoint */
    /* Memory: the per-rank peaks predicted before step 0, and the highest measured (any rank,
     * any step), in mem_names' order. */
    uint64_t predicted[MEM_FIELDS], measured[MEM_FIELDS];
    /* The same of the host memory tier (offload; mt_host_mem_stats): all zero without. */
    uint64_t predicted_host[MEM_FIELDS], measured_host[MEM_FIELDS];
    uint64_t predicted_setup, measured_setup; /* the total before step 0 (build and sharding) */
} trainer;

static const char usage[] =
    "usage: mtrun [mtrun options] " PROG " [options]\n"
    "  --dp N              data-parallel (FSDP) size (default world size / tp)\n"
    "  --tp N              tensor-parallel size, ranks of one host (default 1)\n"
    "  --layers N          transformer blocks (2)\n"
    "  --d-model N         channels (64)\n"
    "  --heads N           attention heads, divisible by tp (4)\n"
    "  --seq N             tokens per sequence (64)\n"
    "  --batch N           sequences per dp rank per micro-batch (8)\n"
    "  --grad-accum N      micro-batches per step (1)\n"
    "  --steps N           optimizer steps (300)\n"
    "  --lr X              peak learning rate (1e-3)\n"
    "  --warmup N          steps of linear warmup, then constant (0)\n"
    "  --weight-decay X    AdamW decoupled weight decay (0)\n"
    "  --clip X            clip the global gradient norm to X; 0 = off (1)\n"
    "  --seed N            model initialisation and data order (1)\n"
    "  --param-dtype T     f32 or bf16: parameters gathered and computed in (f32)\n"
    "  --reduce-dtype T    f32 or bf16: gradients reduced in (f32)\n"
    "  --no-prefetch       issue each all-gather when its unit starts\n"
    "  --mapped-gather 0|1 1: on the CPU with every dp rank on one host, gather a unit whose\n"
    "                      shard is >= 1 MiB by mapping every rank's shard (no copy, no\n"
    "                      gathered buffer); 0: copy as an all-gather (1)\n"
    "  --reshard-after-forward 0|1\n"
    "                      1: free every unit's gathered parameters after its forward and\n"
    "                      gather them again in backward; 0: keep them until the backward\n"
    "                      (one all-gather per unit per micro-batch instead of two, the whole\n"
    "                      model's parameters held at once) (default: 1 for the blocks, 0 for\n"
    "                      the root)\n"
    "  --offload P         none, optimizer (f32 master, gradient shards and AdamW state in host\n"
    "                      memory) or full (parameters too; the device holds only the units in\n"
    "                      flight) (none); docs/offload.md\n"
    "  --offload-ratio R   with --offload: the fraction of units offloaded, in [0, 1] (1)\n"
    "  --offload-overlap   with --offload optimizer|full and --clip 0: step each offloaded unit\n"
    "                      as soon as its gradient is on the host, during the backward (off)\n"
    "  --predict-memory    print the predicted per-rank memory peaks and stop, before anything\n"
    "                      is allocated (exit 3 when they exceed MT_CPU_DEVICE_MEMORY)\n"
    "  --activation-checkpointing none|full|every:K\n"
    "                      blocks that recompute their activations in backward instead of\n"
    "                      keeping them: none, all, or every K-th (blocks 0, K, 2K, ...) (none)\n"
    "  --sequence-parallel[=regather|keep-gathered]\n"
    "                      shard LayerNorm and residual activations over tp by tokens; the\n"
    "                      column-parallel inputs are gathered again in backward (regather)\n"
    "                      or kept gathered from the forward (keep-gathered)\n"
    "  --device D          cpu, cuda or auto (MT_DEVICE, else auto)\n"
    "  --vocab N           vocabulary size; every token id must be below it (256)\n"
    "  --data FILE         training text, bytes as tokens (" DEFAULT_DATA ")\n"
    "  --token-file FILE   training tokens instead: little-endian uint16 ids, each < --vocab\n"
    "  --eval-every N      held-out loss every N steps and at the end; 0 = never (0)\n"
    "  --metrics FILE      JSON lines: one per step and one per evaluation (rank 0 writes)\n"
    "  --peak-tflops X     bf16 dense peak per GPU for MFU (default from the GPU model:\n"
    "                      H100/H200 SXM 989, H100 PCIe 756, A100 312; none on a CPU)\n"
    "  --checkpoint-dir D  save checkpoints into D (step-N folders and D/latest)\n"
    "  --save-every N      save after every N steps and after the last; 0 = never (0)\n"
    "  --keep K            keep the newest K checkpoints; 0 = all (3)\n"
    "  --resume auto|PATH  continue from D's latest checkpoint (auto: if there is one) or from\n"
    "                      PATH (a step-N folder or a checkpoint directory); --steps stays the\n"
    "                      total, so a run resumed at step 6 with --steps 12 runs steps 6-11\n";

/* ---- options ------------------------------------------------------------------------------- */

static int fail_msg(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail_msg(char *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, ERR_CAP, fmt, ap);
    va_end(ap);
    return -1;
}

static int parse_int(const char *name, const char *val, int min, int *out, char *err) {
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < min || v > INT32_MAX)
        return fail_msg(err, "%s '%s' must be an integer >= %d", name, val, min);
    *out = (int)v;
    return 0;
}

static int parse_float(const char *name, const char *val, float min, float *out, char *err) {
    char *end;
    errno = 0;
    float v = strtof(val, &end);
    if (errno || end == val || *end || !isfinite(v) || v < min)
        return fail_msg(err, "%s '%s' must be a number >= %g", name, val, (double)min);
    *out = v;
    return 0;
}

static int parse_dtype(const char *name, const char *val, mt_dtype *out, char *err) {
    if (mt_dtype_parse(val, out) != MT_OK) {
        mt_clear_error();
        return fail_msg(err, "%s '%s' must be f32 or bf16", name, val);
    }
    return 0;
}

/* none: 0, full: 1 (every block), every:K: K. */
static int parse_recompute(const char *name, const char *val, int *every, char *err) {
    if (!strcmp(val, "none")) *every = 0;
    else if (!strcmp(val, "full")) *every = 1;
    else if (!strncmp(val, "every:", 6)) {
        char *end;
        errno = 0;
        long k = strtol(val + 6, &end, 10);
        if (errno || end == val + 6 || *end || k < 1 || k > INT32_MAX)
            return fail_msg(err, "%s '%s': K in every:K must be an integer >= 1", name, val);
        *every = (int)k;
    } else {
        return fail_msg(err, "%s '%s' must be none, full or every:K", name, val);
    }
    return 0;
}

static const char *offload_name(mt_offload p) {
    return p == MT_OFFLOAD_FULL ? "full" : p == MT_OFFLOAD_OPTIMIZER ? "optimizer" : "none";
}

static int parse_offload(const char *name, const char *val, mt_offload *out, char *err) {
    if (!strcmp(val, "none")) *out = MT_OFFLOAD_NONE;
    else if (!strcmp(val, "optimizer")) *out = MT_OFFLOAD_OPTIMIZER;
    else if (!strcmp(val, "full")) *out = MT_OFFLOAD_FULL;
    else return fail_msg(err, "%s '%s' must be none, optimizer or full", name, val);
    return 0;
}

/* A fraction in [0, 1]; the engine checks it again (mt_fsdp_shard), this says it before any
 * rank starts. */
static int parse_ratio(const char *name, const char *val, float *out, char *err) {
    char *end;
    errno = 0;
    double r = strtod(val, &end);
    if (errno || end == val || *end || !(r >= 0.0 && r <= 1.0))
        return fail_msg(err, "%s '%s' must be a number in [0, 1] (the fraction of FSDP units "
                        "offloaded)", name, val);
    *out = (float)r;
    return 0;
}

/* Returns 0 (options in *o), 1 (--help) or -1 (message in err). */
static int parse_args(int argc, char **argv, options *o, char *err) {
    *o = (options){.dp = 0, .tp = 1, .layers = 2, .d_model = 64, .heads = 4, .seq = 64,
                   .batch = 8, .grad_accum = 1, .steps = 300, .warmup = 0, .eval_every = 0,
                   .vocab = 256,
                   .lr = 1e-3f, .weight_decay = 0.0f, .clip = 1.0f, .seed = 1,
                   .param_dtype = MT_F32, .reduce_dtype = MT_F32, .prefetch = true,
                   .reshard_after_forward = -1, .offload = MT_OFFLOAD_NONE, .offload_ratio = 1.0f,
                   .mapped_gather = true, .device = NULL, .data = DEFAULT_DATA, .metrics = NULL,
                   .keep = 3};
    for (int i = 1; i < argc; i++) {
        char name[64];
        const char *arg = argv[i], *eq = strchr(arg, '=');
        const char *val;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return 1;
        if (strcmp(arg, "--no-prefetch") == 0) {
            o->prefetch = false;
            continue;
        }
        if (strcmp(arg, "--offload-overlap") == 0) {
            o->offload_overlap = true;
            continue;
        }
        if (strcmp(arg, "--predict-memory") == 0) {
            o->predict_only = true;
            continue;
        }
        if (strcmp(arg, "--sequence-parallel") == 0 ||
            strcmp(arg, "--sequence-parallel=regather") == 0) {
            o->sequence_parallel = MT_GPT_SP_REGATHER;
            continue;
        }
        if (strcmp(arg, "--sequence-parallel=keep-gathered") == 0) {
            o->sequence_parallel = MT_GPT_SP_KEEP_GATHERED;
            continue;
        }
        if (strncmp(arg, "--sequence-parallel=", 20) == 0)
            return fail_msg(err, "--sequence-parallel '%s': the mode is regather (the default) "
                            "or keep-gathered", arg + 20);
        if (strncmp(arg, "--", 2) != 0) return fail_msg(err, "unexpected argument '%s'", arg);
        if (eq) { /* --opt=value */
            snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
            if (i + 1 >= argc) return fail_msg(err, "%s needs a value", arg);
            val = argv[++i];
        }
        int rc;
        uint64_t seed;
        char *end;
        static const struct { const char *name; unsigned bit; } model_opts[] = {
            {"--layers", MODEL_LAYERS}, {"--d-model", MODEL_D_MODEL}, {"--heads", MODEL_HEADS},
            {"--seq", MODEL_SEQ}, {"--vocab", MODEL_VOCAB}, {"--seed", RUN_SEED},
            {"--lr", RUN_LR}, {"--warmup", RUN_WARMUP}, {"--weight-decay", RUN_WEIGHT_DECAY},
            {"--clip", RUN_CLIP}};
        for (size_t k = 0; k < sizeof model_opts / sizeof *model_opts; k++)
            if (!strcmp(name, model_opts[k].name)) o->model_given |= model_opts[k].bit;
        if (!strcmp(name, "--dp")) rc = parse_int(name, val, 1, &o->dp, err);
        else if (!strcmp(name, "--tp")) rc = parse_int(name, val, 1, &o->tp, err);
        else if (!strcmp(name, "--layers")) rc = parse_int(name, val, 1, &o->layers, err);
        else if (!strcmp(name, "--d-model")) rc = parse_int(name, val, 1, &o->d_model, err);
        else if (!strcmp(name, "--heads")) rc = parse_int(name, val, 1, &o->heads, err);
        else if (!strcmp(name, "--seq")) rc = parse_int(name, val, 1, &o->seq, err);
        else if (!strcmp(name, "--vocab")) rc = parse_int(name, val, 1, &o->vocab, err);
        else if (!strcmp(name, "--batch")) rc = parse_int(name, val, 1, &o->batch, err);
        else if (!strcmp(name, "--grad-accum")) rc = parse_int(name, val, 1, &o->grad_accum, err);
        else if (!strcmp(name, "--steps")) rc = parse_int(name, val, 0, &o->steps, err);
        else if (!strcmp(name, "--warmup")) rc = parse_int(name, val, 0, &o->warmup, err);
        else if (!strcmp(name, "--eval-every")) rc = parse_int(name, val, 0, &o->eval_every, err);
        else if (!strcmp(name, "--save-every")) rc = parse_int(name, val, 0, &o->save_every, err);
        else if (!strcmp(name, "--keep")) rc = parse_int(name, val, 0, &o->keep, err);
        else if (!strcmp(name, "--lr")) rc = parse_float(name, val, 0.0f, &o->lr, err);
        else if (!strcmp(name, "--weight-decay"))
            rc = parse_float(name, val, 0.0f, &o->weight_decay, err);
        else if (!strcmp(name, "--clip")) rc = parse_float(name, val, 0.0f, &o->clip, err);
        else if (!strcmp(name, "--peak-tflops"))
            rc = parse_float(name, val, 0.0f, &o->peak_tflops, err);
        else if (!strcmp(name, "--param-dtype")) rc = parse_dtype(name, val, &o->param_dtype, err);
        else if (!strcmp(name, "--offload")) rc = parse_offload(name, val, &o->offload, err);
        else if (!strcmp(name, "--offload-ratio"))
            rc = parse_ratio(name, val, &o->offload_ratio, err);
        else if (!strcmp(name, "--activation-checkpointing"))
            rc = parse_recompute(name, val, &o->recompute_every, err);
        else if (!strcmp(name, "--reshard-after-forward")) {
            rc = strcmp(val, "0") && strcmp(val, "1")
                     ? fail_msg(err, "%s '%s' must be 0 or 1", name, val)
                     : 0;
            if (!rc) o->reshard_after_forward = val[0] - '0';
        } else if (!strcmp(name, "--mapped-gather")) {
            rc = strcmp(val, "0") && strcmp(val, "1")
                     ? fail_msg(err, "%s '%s' must be 0 or 1", name, val)
                     : 0;
            if (!rc) o->mapped_gather = val[0] == '1';
        } else if (!strcmp(name, "--reduce-dtype"))
            rc = parse_dtype(name, val, &o->reduce_dtype, err);
        else if (!strcmp(name, "--seed")) {
            errno = 0;
            seed = strtoull(val, &end, 10);
            rc = errno || end == val || *end || val[0] == '-'
                     ? fail_msg(err, "--seed '%s' must be a non-negative integer", val)
                     : 0;
            o->seed = seed;
        } else if (!strcmp(name, "--device")) {
            rc = strcmp(val, "cpu") && strcmp(val, "cuda") && strcmp(val, "auto")
                     ? fail_msg(err, "--device '%s' must be cpu, cuda or auto", val)
                     : 0;
            o->device = val;
        } else if (!strcmp(name, "--data")) {
            rc = *val ? 0 : fail_msg(err, "--data needs a file name");
            o->data = val;
            o->data_given = true;
        } else if (!strcmp(name, "--token-file")) {
            rc = *val ? 0 : fail_msg(err, "--token-file needs a file name");
            o->token_file = val;
        } else if (!strcmp(name, "--checkpoint-dir")) {
            rc = *val ? 0 : fail_msg(err, "--checkpoint-dir needs a folder name");
            o->ckpt_dir = val;
        } else if (!strcmp(name, "--resume")) {
            rc = *val ? 0 : fail_msg(err, "--resume needs 'auto' or a checkpoint path");
            o->resume = val;
        } else if (!strcmp(name, "--metrics")) {
            rc = *val ? 0 : fail_msg(err, "--metrics needs a file name");
            o->metrics = val;
        } else {
            rc = fail_msg(err, "unknown option '%s' (see --help)", name);
        }
        if (rc) return rc;
    }
    if (o->lr <= 0.0f) return fail_msg(err, "--lr %g must be > 0", (double)o->lr);
    if (o->offload_overlap && o->offload == MT_OFFLOAD_NONE)
        return fail_msg(err, "--offload-overlap needs --offload optimizer or full (it overlaps "
                        "the host optimizer step of offloaded units with the backward)");
    /* The norm needs every gradient, the overlap steps units before the last one exists. */
    if (o->offload_overlap && o->clip > 0.0f)
        return fail_msg(err, "--offload-overlap needs --clip 0 (clipping at %g needs the global "
                        "gradient norm before any unit is stepped)", (double)o->clip);
    if (o->save_every > 0 && !o->ckpt_dir)
        return fail_msg(err, "--save-every %d needs --checkpoint-dir", o->save_every);
    if (o->resume && !strcmp(o->resume, "auto") && !o->ckpt_dir)
        return fail_msg(err, "--resume auto needs --checkpoint-dir (the folder to look in)");
    if (o->data_given && o->token_file)
        return fail_msg(err, "--data '%s' and --token-file '%s' are exclusive: give one (--data "
                        "reads bytes as tokens, --token-file little-endian uint16 ids)", o->data,
                        o->token_file);
    return 0;
}

/* The checks that need the world size; identical on every rank, so every rank fails alike. */
static int check_shape(options *o, int world, char *err) {
    if (o->dp == 0) {
        if (world % o->tp != 0)
            return fail_msg(err, "tp %d does not divide the world size %d", o->tp, world);
        o->dp = world / o->tp;
    }
    if ((long)o->dp * o->tp != world)
        return fail_msg(err, "dp %d x tp %d = %ld != world size %d", o->dp, o->tp,
                        (long)o->dp * o->tp, world);
    if (o->heads % o->tp != 0)
        return fail_msg(err, "heads %d not divisible by tp %d", o->heads, o->tp);
    if (o->d_model % o->heads != 0)
        return fail_msg(err, "d-model %d not divisible by heads %d", o->d_model, o->heads);
    if (o->sequence_parallel && o->seq % o->tp != 0)
        return fail_msg(err, "sequence parallelism: seq %d not divisible by tp %d", o->seq,
                        o->tp);
    /* The model pads the vocabulary to a multiple of tp; it refuses a split that leaves the last
     * tp rank no real id, which --vocab can now ask for: refuse it here, once, with the others. */
    long local = ((long)o->vocab + o->tp - 1) / o->tp;
    if (o->vocab - (o->tp - 1) * local < 1)
        return fail_msg(err, "vocab %d cannot be split over tp %d: padded to %ld, the last tp "
                        "rank's %ld rows would hold no real id", o->vocab, o->tp, local * o->tp,
                        local);
    return 0;
}

/* ---- checkpoints: what a resumed run starts from --------------------------------------------- */

/* The model configuration saved with each checkpoint (and written by mt-ckpt import). */
#define CONFIG_FORMAT \
    "{\"model\": \"gpt2\", \"layers\": %d, \"d_model\": %d, \"heads\": %d, \"seq\": %d, " \
    "\"vocab\": %d}"

/* The schedule (data order from the seed, learning rate, warmup, weight decay, clipping) of a
 * checkpoint of train_gpt: what is not given on the command line continues as saved, so that
 * `--resume auto` alone continues the run exactly; what is given wins, and rank 0 says so
 * (changing the learning rate of a resumed run is legitimate; the seed changes the data). */
static int resume_schedule(options *o, char *err) {
    void *text = NULL;
    size_t len = 0;
    mt_status st = mt_checkpoint_read_extra(o->resume_path, RUN_EXTRA, &text, &len);
    if (st == MT_ERR_NOT_FOUND) { /* an imported model (mt-ckpt import): nothing to continue */
        mt_clear_error();
        return 0;
    }
    if (st != MT_OK) { /* damaged, unreadable: not a reason to start over silently */
        fail_msg(err, "--resume: %s", mt_last_error());
        mt_clear_error();
        return -1;
    }
    /* Saved by train_gpt, which saves its step and optimizer with its schedule. */
    o->resume_optimizer = true;
    unsigned long long seed;
    float lr, wd, clip;
    int warmup;
    int n = sscanf(text, RUN_SCAN, &seed, &lr, &warmup, &wd, &clip);
    free(text);
    if (n != 5)
        return fail_msg(err, "--resume: the schedule in '%s' is not train_gpt's", o->resume_path);
    size_t at = 0;
#define TAKE(bit, field, value, fmt, name)                                                        \
    do {                                                                                           \
        if (!(o->model_given & (bit))) field = (value);                                           \
        else if (field != (value) && at < sizeof o->resume_note)                                  \
            at += (size_t)snprintf(o->resume_note + at, sizeof o->resume_note - at,                \
                                   "%s%s " fmt " instead of the checkpoint's " fmt, at ? ", " : "", \
                                   name, field, value);                                            \
    } while (0)
    unsigned long long given_seed = o->seed;
    TAKE(RUN_SEED, given_seed, seed, "%llu", "--seed (data order)");
    o->seed = given_seed;
    TAKE(RUN_LR, o->lr, lr, "%g", "--lr"); /* floats: printf promotes them to double */
    TAKE(RUN_WARMUP, o->warmup, warmup, "%d", "--warmup");
    TAKE(RUN_WEIGHT_DECAY, o->weight_decay, wd, "%g", "--weight-decay");
    TAKE(RUN_CLIP, o->clip, clip, "%g", "--clip");
#undef TAKE
    return 0;
}

/* With --resume: finds the checkpoint, and takes the model's shape from it (a shape option given
 * on the command line must agree). Every rank reads the same files, so every rank decides alike;
 * 0, or -1 with the message in err. */
static int resolve_resume(options *o, char *err) {
    if (!o->resume) return 0;
    bool automatic = !strcmp(o->resume, "auto"), found = false;
    const char *where = automatic ? o->ckpt_dir : o->resume;
    if (mt_checkpoint_resolve(where, o->resume_path, sizeof o->resume_path, &found) != MT_OK) {
        fail_msg(err, "--resume %s: %s", o->resume, mt_last_error());
        mt_clear_error();
        return -1;
    }
    if (!found) {
        o->resume_path[0] = '\0';
        if (automatic) return 0; /* nothing saved yet: start at step 0 */
        return fail_msg(err, "--resume '%s': no checkpoint there (neither metadata.json nor a "
                        "'latest' file)", where);
    }
    void *text = NULL;
    size_t len = 0;
    if (mt_checkpoint_read_extra(o->resume_path, CONFIG_EXTRA, &text, &len) != MT_OK) {
        fail_msg(err, "--resume: %s", mt_last_error());
        mt_clear_error();
        return -1;
    }
    int v[5];
    int n = sscanf(text, CONFIG_FORMAT, &v[0], &v[1], &v[2], &v[3], &v[4]);
    free(text);
    if (n != 5)
        return fail_msg(err, "--resume: the model configuration in '%s' is not a GPT-2 "
                        "configuration of train_gpt", o->resume_path);
    static const char *const names[5] = {"--layers", "--d-model", "--heads", "--seq", "--vocab"};
    int *fields[5] = {&o->layers, &o->d_model, &o->heads, &o->seq, &o->vocab};
    for (int i = 0; i < 5; i++) {
        if ((o->model_given & (1u << i)) && *fields[i] != v[i])
            return fail_msg(err, "%s %d differs from the checkpoint's %d ('%s'): a resumed run "
                            "takes the model's shape from its checkpoint", names[i], *fields[i],
                            v[i], o->resume_path);
        *fields[i] = v[i];
    }
    /* A checkpoint of train_gpt carries its schedule, step and optimizer; an imported model
     * (mt-ckpt import) does not, and starts at step 0 with a fresh optimizer. */
    return resume_schedule(o, err);
}

/* ---- data ---------------------------------------------------------------------------------- */

/* Reads the whole file into *buf (malloc'd with room for `room_per_byte` x its size bytes, so a
 * caller can widen it in place); *size gets its size in bytes. */
static int read_file(const char *path, const char *what, size_t room_per_byte, void **buf,
                     size_t *size, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return fail_msg(err, "cannot open %s '%s': %s", what, path, strerror(errno));
    int rc = 0;
    long end = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (end < 0 || fseek(f, 0, SEEK_SET) != 0) {
        rc = fail_msg(err, "cannot read %s '%s': %s", what, path, strerror(errno));
    } else {
        *size = (size_t)end;
        *buf = malloc(*size ? *size * room_per_byte : 1);
        if (!*buf)
            rc = fail_msg(err, "no memory for the %zu bytes of %s '%s'", *size, what, path);
        else if (fread(*buf, 1, *size, f) != *size)
            rc = fail_msg(err, "cannot read %s '%s': %s", what, path,
                          ferror(f) ? strerror(errno) : "shorter than its size");
    }
    fclose(f);
    return rc;
}

/* The token ids of --data (its bytes) or --token-file (little-endian uint16), each checked
 * against --vocab here, once, so that a bad id is named by its place in the file rather than
 * found by the model in some later batch. */
static int load_data(const options *o, dataset *d, char *err) {
    bool tokens = o->token_file != NULL;
    d->path = tokens ? o->token_file : o->data;
    d->unit = tokens ? "tokens" : "bytes";
    void *buf = NULL;
    size_t bytes = 0;
    /* One buffer for the file and its ids: bytes widen to uint16 in place (2 bytes of room per
     * byte), uint16 ids decode in place; a large token file is not held twice. */
    int rc = read_file(d->path, tokens ? "token file" : "data file", tokens ? 1 : 2, &buf, &bytes,
                       err);
    d->ids = buf;
    if (rc) return rc;
    const unsigned char *raw = buf;
    if (tokens) {
        if (bytes % 2 != 0)
            return fail_msg(err, "token file '%s' has %zu bytes: not a whole number of 2-byte "
                            "(little-endian uint16) token ids", d->path, bytes);
        d->size = bytes / 2;
        /* Explicitly little-endian, whatever the host's order; id i only reads bytes 2i, 2i+1. */
        for (size_t i = 0; i < d->size; i++)
            d->ids[i] = (uint16_t)(raw[2 * i] | (unsigned)raw[2 * i + 1] << 8);
    } else {
        d->size = bytes;
        /* Backwards: id i (bytes 2i, 2i + 1) overwrites no byte below i, those yet to read. */
        for (size_t i = d->size; i-- > 0;) d->ids[i] = raw[i];
    }
    for (size_t i = 0; i < d->size; i++) {
        if (d->ids[i] < (unsigned)o->vocab) continue;
        if (tokens)
            return fail_msg(err, "token file '%s': id %u at position %zu (byte offset %zu) is not "
                            "below --vocab %d", d->path, (unsigned)d->ids[i], i, 2 * i, o->vocab);
        return fail_msg(err, "--vocab %d is too small for data file '%s': its bytes are the token "
                        "ids and byte %zu is %u (use --vocab 256, or a --token-file)", o->vocab,
                        d->path, i, (unsigned)d->ids[i]);
    }
    d->val_len = d->size / 10;
    d->train_len = d->size - d->val_len;
    size_t need = (size_t)o->seq + 1; /* inputs and the targets shifted by one */
    if (d->train_len < need)
        return fail_msg(err, "seq %d is longer than the data: a sequence needs %zu %s but the "
                        "training part of '%s' (90%% of %zu %s) has %zu",
                        o->seq, need, d->unit, d->path, d->size, d->unit, d->train_len);
    if (o->eval_every > 0 && d->val_len < need)
        return fail_msg(err, "seq %d is longer than the held-out data: a sequence needs %zu "
                        "%s but the last 10%% of '%s' (%zu %s) has %zu",
                        o->seq, need, d->unit, d->path, d->size, d->unit, d->val_len);
    return 0;
}

static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Fills tokens with this dp rank's `batch` windows of seq + 1 ids for (step, micro). A window
 * is chosen by the sequence's index in the global batch (dp rank * batch + b), not by the rank,
 * so that dp 2 with --batch 4 trains on exactly the sequences of dp 1 with --batch 8. */
static void fill_batch(const trainer *t, bool eval, int step, int micro) {
    const options *o = t->opt;
    const uint16_t *src = t->data.ids + (eval ? t->data.train_len : 0);
    size_t len = eval ? t->data.val_len : t->data.train_len;
    size_t starts = len - (size_t)o->seq; /* windows [s, s + seq] with s < starts */
    for (int b = 0; b < o->batch; b++) {
        uint64_t h = mix64(o->seed ^ (eval ? 0x5EEDull : 0));
        h = mix64(h ^ (uint64_t)step);
        h = mix64(h ^ (uint64_t)micro);
        h = mix64(h ^ ((uint64_t)t->dp_rank * (uint64_t)o->batch + (uint64_t)b));
        const uint16_t *w = src + h % starts;
        int *row = t->tokens + (size_t)b * (o->seq + 1);
        for (int i = 0; i <= o->seq; i++) row[i] = w[i];
    }
}

/* ---- reporting ----------------------------------------------------------------------------- */

/* A failure this program found itself (not the library): its message now, and no earlier library
 * message left for main to print after it. */
static mt_status fail_here(const trainer *t, mt_status st, const char *what) {
    fprintf(stderr, PROG ": rank %d: %s\n", t->rank, what);
    fflush(stderr);
    mt_clear_error();
    return st;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Warmup rises linearly to lr over `warmup` steps (step 0 gets lr / warmup), then stays. */
static float lr_at(const options *o, int step) {
    if (step < o->warmup) return o->lr * (float)(step + 1) / (float)o->warmup;
    return o->lr;
}

/* The memory figures of the metrics (MEM_FIELDS): params, grads, optimizer, activations, comm
 * peaks (mt_mem_category's first five, in its order) and the peak of the total, each the maximum
 * over ranks. */
static const char *const mem_names[MEM_FIELDS] = {"params", "grads", "optimizer", "activations",
                                                  "comm", "total"};

static void peaks_of(const mt_mem_stats *s, uint64_t out[MEM_FIELDS]) {
    uint64_t v[MEM_FIELDS] = {s->peak[MT_MEM_PARAMS], s->peak[MT_MEM_GRADS],
                              s->peak[MT_MEM_OPTIMIZER], s->peak[MT_MEM_ACTIVATIONS],
                              s->peak[MT_MEM_COMM], s->total_peak};
    memcpy(out, v, sizeof v);
}

/* A byte count travels as three exact 22-bit pieces in floats (the collectives reduce f32 and
 * bf16 only), gathered from every rank; rank 0 takes the maximum. The device's peaks go to out,
 * the host tier's (offload) to host, in one all-gather. */
static mt_status gather_peaks(trainer *t, uint64_t out[MEM_FIELDS], uint64_t host[MEM_FIELDS]) {
    enum { F = 2 * MEM_FIELDS };
    mt_mem_stats s;
    uint64_t mine[F], max[F];
    mt_device_mem_stats(mt_runtime_device(t->rt), &s);
    peaks_of(&s, mine);
    mt_host_mem_stats(mt_runtime_device(t->rt), &s);
    peaks_of(&s, mine + MEM_FIELDS);
    float send[F * 3];
    for (int i = 0; i < F; i++)
        for (int k = 0; k < 3; k++) send[i * 3 + k] = (float)((mine[i] >> (22 * k)) & 0x3FFFFF);
    size_t n = (size_t)t->world_size * F * 3;
    float *all = malloc(n * sizeof *all);
    if (!all) return fail_here(t, MT_ERR_OUT_OF_MEMORY, "no memory to gather the memory peaks");
    mt_status st = mt_all_gather(t->world, send, all, F * 3, MT_F32, NULL);
    for (int i = 0; i < F; i++) {
        max[i] = 0;
        for (int r = 0; st == MT_OK && r < t->world_size; r++) {
            const float *p = all + ((size_t)r * F + i) * 3;
            uint64_t v = (uint64_t)p[0] | (uint64_t)p[1] << 22 | (uint64_t)p[2] << 44;
            if (v > max[i]) max[i] = v;
        }
    }
    free(all);
    memcpy(out, max, MEM_FIELDS * sizeof *out);
    memcpy(host, max + MEM_FIELDS, MEM_FIELDS * sizeof *host);
    return st;
}

/* JSON has no NaN or infinity: a diverged value is written as null. */
static void json_number(FILE *f, double v, int digits) {
    if (isfinite(v)) fprintf(f, "%.*g", digits, v);
    else fputs("null", f);
}

/* Times and rates with a fixed number of decimals (no exponent). */
static void json_fixed(FILE *f, double v, int decimals) {
    if (isfinite(v)) fprintf(f, "%.*f", decimals, v);
    else fputs("null", f);
}

/* ", \"name\": {\"params\": ..., \"total\": ...}": one set of memory figures (mem_names). */
static void json_bytes(FILE *f, const char *name, const uint64_t v[MEM_FIELDS]) {
    fprintf(f, ", \"%s\": {", name);
    for (int i = 0; i < MEM_FIELDS; i++)
        fprintf(f, "%s\"%s\": %llu", i ? ", " : "", mem_names[i], (unsigned long long)v[i]);
    fputc('}', f);
}

static void write_step_metrics(trainer *t, int step, float loss, float lr, float norm,
                               double ms, double tps, double mfu,
                               const uint64_t peaks[MEM_FIELDS],
                               const uint64_t host[MEM_FIELDS]) {
    FILE *f = t->metrics;
    fprintf(f, "{\"step\": %d, \"loss\": ", step);
    json_number(f, loss, 9);
    fputs(", \"lr\": ", f);
    json_number(f, lr, 7); /* as given: a float holds ~7 digits */
    fputs(", \"grad_norm\": ", f);
    json_number(f, norm, 9);
    fputs(", \"step_ms\": ", f);
    json_fixed(f, ms, 3);
    fputs(", \"tokens_per_s\": ", f);
    json_fixed(f, tps, 1);
    fputs(", \"mfu\": ", f);
    json_fixed(f, mfu, 4);
    json_bytes(f, "peak_bytes", peaks);
    json_bytes(f, "predicted_peak_bytes", t->predicted);
    json_bytes(f, "host_peak_bytes", host);
    json_bytes(f, "predicted_host_peak_bytes", t->predicted_host);
    fprintf(f, ", \"setup_peak_bytes\": {\"predicted\": %llu, \"measured\": %llu}}\n",
            (unsigned long long)t->predicted_setup, (unsigned long long)t->measured_setup);
    fflush(f);
}

/* ---- memory prediction ----------------------------------------------------------------------- */

/* The one place the options become a memory plan (mt_gpt_memory_predict): every option that
 * changes what the step allocates is set here. */
static void fill_memory_plan(const trainer *t, mt_gpt_memory_plan *plan) {
    const options *o = t->opt;
    *plan = mt_gpt_memory_plan_defaults();
    plan->dp = o->dp;
    plan->tp = o->tp;
    plan->batch = o->batch;
    plan->grad_accum = o->grad_accum;
    plan->param_dtype = o->param_dtype;
    plan->reduce_dtype = o->reduce_dtype;
    plan->prefetch = o->prefetch;
    plan->reshard_after_forward = o->reshard_after_forward;
    plan->mapped_gather = o->mapped_gather;
    plan->activation_checkpointing = o->recompute_every == 0   ? MT_GPT_AC_NONE
                                     : o->recompute_every == 1 ? MT_GPT_AC_FULL
                                                               : MT_GPT_AC_EVERY;
    plan->ac_every = o->recompute_every;
    plan->sequence_parallel = o->sequence_parallel;
    plan->offload = o->offload;
    plan->offload_ratio = o->offload_ratio;
    plan->cpu_device = mt_device_get_kind(mt_runtime_device(t->rt)) == MT_DEVICE_CPU;
    /* The transport reads this the same way (comm/host/ucx.c), and a value out of its range
     * has stopped mt_init already. */
    const char *small = getenv("MT_COMM_SMALL_BYTES");
    size_t v = 0;
    if (small && *small && mt_parse_bytes(small, &v) == MT_OK && v > 0)
        plan->comm_small_bytes = v;
}

/* Predicts the per-rank peaks of a step before step 0; rank 0 prints them with the device's
 * capacity, and says plainly when the predicted total does not fit. */
static mt_status predict_memory(trainer *t) {
    const options *o = t->opt;
    mt_gpt_config cfg = {.layers = o->layers, .d_model = o->d_model, .heads = o->heads,
                         .seq = o->seq, .vocab = o->vocab, .seed = o->seed,
                         .defer_init = true /* as build() creates it */};
    mt_gpt_memory_plan plan;
    mt_gpt_memory_prediction p;
    fill_memory_plan(t, &plan);
    MT_TRY(mt_gpt_memory_predict(&cfg, &plan, &p));
    for (int i = 0; i < MEM_FIELDS - 1; i++) t->predicted[i] = p.peak[i];
    t->predicted[MEM_FIELDS - 1] = p.total_peak;
    static const mt_mem_category cats[MEM_FIELDS - 1] = {
        MT_MEM_PARAMS, MT_MEM_GRADS, MT_MEM_OPTIMIZER, MT_MEM_ACTIVATIONS, MT_MEM_COMM};
    for (int i = 0; i < MEM_FIELDS - 1; i++) t->predicted_host[i] = p.host_peak[cats[i]];
    t->predicted_host[MEM_FIELDS - 1] = p.host_total_peak;
    t->predicted_setup = p.setup_peak;
    mt_mem_stats ms;
    mt_device_mem_stats(mt_runtime_device(t->rt), &ms);
    /* Building and sharding the model may need more than a step (a large model on many dp
     * ranks with a small batch): what must fit is the larger. */
    size_t need = p.setup_peak > p.total_peak ? p.setup_peak : p.total_peak;
    t->predicted_fits = ms.capacity == 0 || need <= ms.capacity;
    if (t->rank != 0) return MT_OK;
    char a[32], b[32];
    printf(PROG ": predicted per-rank peak of a step%s:\n",
           plan.cpu_device ? "" : " (NCCL's own buffers not included in comm)");
    for (int i = 0; i < MEM_FIELDS - 1; i++)
        printf("  %-12s %12s\n", mem_names[i], mt_format_bytes(p.peak[i], a, sizeof a));
    printf("  %-12s %12s  (during %s; %s of it held between steps)\n", "total",
           mt_format_bytes(p.total_peak, a, sizeof a), p.total_peak_at,
           mt_format_bytes(p.persistent, b, sizeof b));
    printf("  %-12s %12s  (building and sharding the model, before step 0)\n", "setup",
           mt_format_bytes(p.setup_peak, a, sizeof a));
    if (o->offload) {
        printf(PROG ": predicted per-rank peak of the host memory tier (--offload %s, ratio %g):\n",
               offload_name(o->offload), (double)o->offload_ratio);
        for (int i = 0; i < MEM_FIELDS; i++)
            printf("  %-12s %12s\n", mem_names[i],
                   mt_format_bytes((size_t)t->predicted_host[i], a, sizeof a));
    }
    if (ms.capacity == 0)
        printf("  %-12s %12s  (MT_CPU_DEVICE_MEMORY sets one)\n", "capacity", "unlimited");
    else if (need <= ms.capacity)
        printf("  %-12s %12s  (fits: %s to spare)\n", "capacity",
               mt_format_bytes(ms.capacity, a, sizeof a),
               mt_format_bytes(ms.capacity - need, b, sizeof b));
    else
        printf("  %-12s %12s\n" PROG ": WARNING: the predicted peak %s exceeds the device's "
               "capacity %s: this configuration is expected to run out of device memory (a "
               "smaller --batch, more --dp or --tp, --activation-checkpointing, --sequence-parallel or "
               "bf16 parameters need less)\n",
               "capacity", mt_format_bytes(ms.capacity, b, sizeof b),
               mt_format_bytes(need, a, sizeof a), b);
    fflush(stdout);
    return MT_OK;
}

/* Rank 0, at the end: the highest measured peaks (over ranks and steps) beside the predictions. */
static void print_comparison_rows(const uint64_t *pred, const uint64_t *meas) {
    printf("  %-12s %12s %12s %9s\n", "category", "predicted", "measured", "ratio");
    for (int i = 0; i < MEM_FIELDS; i++) {
        char a[32], b[32], ratio[16] = "-";
        if (pred[i] > 0) snprintf(ratio, sizeof ratio, "%.3f", (double)meas[i] / (double)pred[i]);
        printf("  %-12s %12s %12s %9s\n", mem_names[i],
               mt_format_bytes((size_t)pred[i], a, sizeof a),
               mt_format_bytes((size_t)meas[i], b, sizeof b), ratio);
    }
}

static void print_memory_comparison(const trainer *t) {
    printf("memory per rank: predicted vs measured peak (max over ranks and steps):\n");
    print_comparison_rows(t->predicted, t->measured);
    char a[32], b[32];
    printf("  %-12s %12s %12s %9.3f\n", "setup total",
           mt_format_bytes((size_t)t->predicted_setup, a, sizeof a),
           mt_format_bytes((size_t)t->measured_setup, b, sizeof b),
           t->predicted_setup ? (double)t->measured_setup / (double)t->predicted_setup : 0.0);
    if (t->opt->offload) {
        printf("host memory tier per rank: predicted vs measured peak (max over ranks and "
               "steps):\n");
        print_comparison_rows(t->predicted_host, t->measured_host);
    }
}

/* ---- model FLOPs utilisation ---------------------------------------------------------------- */

/* bf16 dense tensor-core peak (TFLOP/s, no sparsity) of the GPUs whose MFU is usually quoted; the
 * first match in the CUDA device name wins. 0 for anything else. */
static double known_peak_tflops(const char *model) {
    static const struct { const char *needle; double tflops; } table[] = {
        {"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"H200", 989.0}, {"H100", 989.0},
        {"A100", 312.0},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (strstr(model, table[i].needle)) return table[i].tflops;
    return 0.0;
}

/* Training FLOPs per token, as PaLM's appendix and llm.c count them: 6 per parameter (forward
 * and backward of every matrix product; the embedding lookup is counted as if it were one) plus
 * the attention scores and mixing, 12 x layers x d_model x seq. The peak is every rank's device:
 * --peak-tflops, else the GPU model's bf16 dense peak; a CPU device has none (no MFU). */
static void setup_mfu(trainer *t) {
    const options *o = t->opt;
    t->flops_per_token = 6.0 * (double)mt_gpt_param_count(t->gpt) +
                         12.0 * o->layers * (double)o->d_model * o->seq;
    mt_device *dev = mt_runtime_device(t->rt);
    double per_device = 0.0;
    if (o->peak_tflops > 0.0f) {
        per_device = o->peak_tflops;
        snprintf(t->peak_source, sizeof t->peak_source, "--peak-tflops");
    } else if (mt_device_get_kind(dev) == MT_DEVICE_CUDA) {
        per_device = known_peak_tflops(mt_device_model(dev));
        snprintf(t->peak_source, sizeof t->peak_source, "%s bf16 dense peak",
                 mt_device_model(dev));
    }
    t->peak_flops = per_device * 1e12 * t->world_size;
}

/* Rank 0: the mesh (every rank's coordinates, host and device) and what the topology offers. */
static mt_status print_summary(trainer *t) {
    const options *o = t->opt;
    mt_device *dev = mt_runtime_device(t->rt);
    float mine[2] = {(float)mt_device_get_kind(dev), (float)mt_device_index(dev)};
    float *all = malloc((size_t)t->world_size * 2 * sizeof *all);
    if (!all) return fail_here(t, MT_ERR_OUT_OF_MEMORY, "no memory for the mesh summary");
    mt_status st = mt_all_gather(t->world, mine, all, 2, MT_F32, NULL);
    if (st != MT_OK || t->rank != 0) {
        free(all);
        return st;
    }
    char why[256] = "";
    int gpus = mt_device_cuda_count(why, sizeof why);
    printf(PROG ": mesh {\"dp\": %d, \"tp\": %d} over %d ranks on %d node(s), %d rank(s) per "
           "node; tp groups are consecutive ranks of one node, dp groups the ranks with the same "
           "tp index\n",
           o->dp, o->tp, t->world_size, mt_runtime_num_nodes(t->rt),
           mt_runtime_local_world_size(t->rt));
    char topo[1024];
    if (mt_runtime_topology_summary(t->rt, topo, sizeof topo) == MT_OK)
        printf(PROG ": topology of node 0 (%s)\n", topo);
    else
        printf(PROG ": topology of node 0 unknown: %s\n", mt_last_error());
    if (gpus > 0) printf(PROG ": %d CUDA GPU(s) on node 0\n", gpus);
    else printf(PROG ": no CUDA GPU (%s); ranks compute on the CPU\n", why);
    printf("  %-5s %-3s %-3s %-28s %s\n", "rank", "dp", "tp", "host", "device");
    for (int r = 0; r < t->world_size; r++) {
        char devname[32];
        if ((int)all[r * 2] == MT_DEVICE_CUDA) snprintf(devname, sizeof devname, "cuda:%d",
                                                        (int)all[r * 2 + 1]);
        else snprintf(devname, sizeof devname, "cpu");
        printf("  %-5d %-3d %-3d %-28s %s\n", r, r / o->tp, r % o->tp,
               mt_runtime_host_of(t->rt, r), devname);
    }
    free(all);
    long tokens = (long)o->dp * o->batch * o->grad_accum * o->seq;
    printf(PROG ": GPT %d layers, d_model %d, %d heads, seq %d, vocab %d: %zu parameters; "
           "params %s, gradients reduced in %s, prefetch %s, reshard after forward %s, "
           "mapped gathers %s, "
           "offload %s (ratio %g), %d of %d "
           "blocks recompute, "
           "sequence parallelism %s\n",
           o->layers, o->d_model, o->heads, o->seq, o->vocab, mt_gpt_param_count(t->gpt),
           mt_dtype_name(o->param_dtype), mt_dtype_name(o->reduce_dtype),
           o->prefetch ? "on" : "off",
           o->reshard_after_forward < 0   ? "blocks"
           : o->reshard_after_forward > 0 ? "all units"
                                          : "none",
           o->mapped_gather ? "where possible" : "off",
           offload_name(o->offload), (double)o->offload_ratio,
           o->recompute_every ? (o->layers + o->recompute_every - 1) / o->recompute_every : 0,
           o->layers,
           o->sequence_parallel && o->tp > 1
               ? (o->sequence_parallel == MT_GPT_SP_KEEP_GATHERED ? "on (inputs kept gathered)"
                                                                  : "on")
               : "off");
    if (t->peak_flops > 0.0)
        printf(PROG ": %.4g FLOP per token (6 x params + 12 x layers x d_model x seq); MFU "
               "against %d x %.4g TFLOP/s (%s)\n", t->flops_per_token, t->world_size,
               t->peak_flops / 1e12 / t->world_size, t->peak_source);
    else
        printf(PROG ": %.4g FLOP per token (6 x params + 12 x layers x d_model x seq); no MFU: "
               "%s\n", t->flops_per_token,
               mt_device_get_kind(mt_runtime_device(t->rt)) == MT_DEVICE_CUDA
                   ? "unknown GPU peak (give --peak-tflops)" : "the device is a CPU");
    printf(PROG ": %s %s: %zu %s, %zu for training, %zu held out; %ld tokens per step "
           "(dp %d x batch %d x grad-accum %d x seq %d); %d steps, lr %g (warmup %d), "
           "weight decay %g, clip %g\n",
           o->token_file ? "token file" : "data", t->data.path, t->data.size, t->data.unit,
           t->data.train_len, t->data.val_len, tokens, o->dp, o->batch,
           o->grad_accum, o->seq, o->steps, (double)o->lr, o->warmup, (double)o->weight_decay,
           (double)o->clip);
    fflush(stdout);
    return MT_OK;
}

/* ---- training ------------------------------------------------------------------------------ */

static mt_status build(trainer *t) {
    const options *o = t->opt;
    MT_TRY(mt_mesh_create(t->rt, 2, (int[]){o->dp, o->tp}, (const char *[]){"dp", "tp"},
                          &t->mesh));
    MT_TRY(mt_mesh_group(t->mesh, "dp", &t->dp_group));
    MT_TRY(mt_mesh_group(t->mesh, "tp", &t->tp_group));
    t->dp_rank = mt_mesh_coord(t->mesh, 0);

    /* Deferred: no rank ever holds a whole parameter; each initialises only its shards after
     * sharding, and a resumed run loads them instead. */
    mt_gpt_config cfg = {.layers = o->layers, .d_model = o->d_model, .heads = o->heads,
                         .seq = o->seq, .vocab = o->vocab, .seed = o->seed, .defer_init = true,
                         .sequence_parallel = o->sequence_parallel};
    snprintf(t->config_json, sizeof t->config_json, CONFIG_FORMAT, o->layers, o->d_model,
             o->heads, o->seq, o->vocab);
    snprintf(t->run_json, sizeof t->run_json, RUN_FORMAT, (unsigned long long)o->seed,
             (double)o->lr, o->warmup, (double)o->weight_decay, (double)o->clip);
    MT_TRY(mt_gpt_create(t->mesh, &cfg, &t->gpt));

    /* fully_shard each block, then the root (embeddings, final LayerNorm) over "dp". */
    mt_fsdp_options fo = mt_fsdp_defaults(t->mesh, "dp");
    fo.param_dtype = o->param_dtype;
    fo.reduce_dtype = o->reduce_dtype;
    fo.reshard_after_forward = o->reshard_after_forward;
    fo.mapped_gather = o->mapped_gather;
    fo.offload = o->offload;
    fo.offload_ratio = o->offload_ratio;
    for (int l = 0; l < o->layers; l++) MT_TRY(mt_fsdp_shard(mt_gpt_block(t->gpt, l), &fo));
    mt_module *root = mt_gpt_root(t->gpt);
    MT_TRY(mt_fsdp_shard(root, &fo));
    if (!o->prefetch) MT_TRY(mt_fsdp_set_prefetch(root, false));
    /* After sharding: FSDP's hooks are outside recompute's, so a block's backward gathers its
     * parameters (prefetching the next block's) before its forward runs again. */
    for (int l = 0; o->recompute_every > 0 && l < o->layers; l += o->recompute_every)
        MT_TRY(mt_recompute_enable(mt_gpt_block(t->gpt, l)));
    /* The seed's initial values, shard by shard; a resumed run loads the checkpoint's instead
     * (resume, after the optimizer exists to load its state into). */
    if (!o->resume_path[0]) MT_TRY(mt_module_init_params(root));

    /* After sharding: the optimizer holds state for this rank's shards only. */
    mt_adamw_options ao = {.lr = o->lr, .weight_decay = o->weight_decay};
    MT_TRY(mt_adamw_create(root, &ao, &t->adam));
    if (o->offload_overlap) MT_TRY(mt_adamw_set_overlap(t->adam, true));

    t->tokens = malloc((size_t)o->batch * (o->seq + 1) * sizeof *t->tokens);
    if (t->rank == 0) t->step_losses = malloc(((size_t)o->steps + 1) * sizeof *t->step_losses);
    if (!t->tokens || (t->rank == 0 && !t->step_losses))
        return fail_here(t, MT_ERR_OUT_OF_MEMORY, "no memory for the token batch");
    return MT_OK;
}

/* Loads the checkpoint resolve_resume found: model, optimizer (when it has one) and step. */
static mt_status resume(trainer *t) {
    const options *o = t->opt;
    int64_t steps_done = 0;
    mt_checkpoint_extra ex = {STEP_EXTRA, &steps_done, sizeof steps_done, false};
    mt_checkpoint_info info;
    MT_TRY(mt_checkpoint_load(mt_gpt_root(t->gpt), t->adam, o->resume_path,
                              o->resume_optimizer ? &ex : NULL, o->resume_optimizer ? 1 : 0,
                              &info));
    if (steps_done > o->steps) {
        char msg[4300];
        snprintf(msg, sizeof msg, "checkpoint '%s' is at step %lld, beyond --steps %d (the total "
                 "number of steps)", info.path, (long long)steps_done, o->steps);
        return fail_here(t, MT_ERR_INVALID_ARG, msg);
    }
    t->first_step = (int)steps_done;
    if (t->rank == 0) {
        printf(PROG ": resumed from %s at step %d (%s)\n", info.path, t->first_step,
               info.has_optimizer ? "model and optimizer state"
                                  : "model only: a fresh optimizer");
        if (o->resume_note[0])
            printf(PROG ": resumed with %s (not a continuation of the saved run)\n",
                   o->resume_note);
        fflush(stdout);
    }
    return MT_OK;
}

/* Saves after `steps_done` steps; the shards are copied before this returns and written in the
 * background while training goes on. */
static mt_status save_checkpoint(trainer *t, int steps_done) {
    const options *o = t->opt;
    t->steps_done = steps_done;
    mt_checkpoint_extra ex[3] = {
        {CONFIG_EXTRA, t->config_json, strlen(t->config_json), false},
        {STEP_EXTRA, &t->steps_done, sizeof t->steps_done, false},
        {RUN_EXTRA, t->run_json, strlen(t->run_json), false}};
    mt_checkpoint_options co = mt_checkpoint_defaults();
    co.step = steps_done;
    co.keep = o->keep;
    co.extras = ex;
    co.n_extras = 3;
    double t0 = now_ms();
    MT_TRY(mt_checkpoint_save(mt_gpt_root(t->gpt), t->adam, o->ckpt_dir, &co));
    if (t->rank == 0) {
        printf(PROG ": checkpoint step-%08d: writing in the background (training stalled "
               "%.1f ms)\n", steps_done, now_ms() - t0);
        fflush(stdout);
    }
    return MT_OK;
}

/* The held-out loss (model after `step` updates), averaged over dp ranks. */
static mt_status evaluate(trainer *t, int step) {
    float sum = 0.0f;
    for (int m = 0; m < EVAL_MICRO_BATCHES; m++) {
        float loss;
        fill_batch(t, true, 0, m); /* the same held-out sequences at every evaluation */
        MT_TRY(mt_gpt_forward(t->gpt, t->tokens, t->opt->batch, &loss));
        sum += loss;
    }
    float val = sum / EVAL_MICRO_BATCHES;
    MT_TRY(mt_all_reduce(t->dp_group, &val, &val, 1, MT_F32, MT_REDUCE_AVG, NULL));
    if (t->rank == 0) {
        printf("eval step %d | val loss %.4f\n", step, (double)val);
        fflush(stdout);
        if (t->metrics) {
            fprintf(t->metrics, "{\"step\": %d, \"val_loss\": ", step);
            json_number(t->metrics, val, 9);
            fputs("}\n", t->metrics);
            fflush(t->metrics);
        }
    }
    return MT_OK;
}

static mt_status train_step(trainer *t, int step) {
    const options *o = t->opt;
    mt_module *root = mt_gpt_root(t->gpt);
    mt_device_reset_peaks(mt_runtime_device(t->rt)); /* peaks are per step */
    mt_group_counters_reset(t->tp_group);             /* and so is the traffic */
    mt_group_counters_reset(t->dp_group);
    double t0 = now_ms();
    float lr = lr_at(o, step), sum = 0.0f, norm = 0.0f;
    mt_adamw_set_lr(t->adam, lr);
    for (int m = 0; m < o->grad_accum; m++) {
        /* Gradients are reduced over dp once, after the last micro-batch. */
        if (o->grad_accum > 1)
            MT_TRY(mt_fsdp_set_requires_gradient_sync(root, m == o->grad_accum - 1));
        float loss;
        fill_batch(t, false, step, m);
        MT_TRY(mt_gpt_forward_backward(t->gpt, t->tokens, o->batch, 1.0f / (float)o->grad_accum,
                                       &loss));
        sum += loss;
    }
    MT_TRY(mt_clip_grad_norm(root, o->clip, &norm));
    MT_TRY(mt_adamw_step(t->adam));
    MT_TRY(mt_zero_grad(root));
    mt_group_counters(t->tp_group, &t->tp_traffic);
    mt_group_counters(t->dp_group, &t->dp_traffic);
    /* Every dp rank saw as many tokens: the global loss is the mean of theirs. */
    float loss = sum / (float)o->grad_accum;
    MT_TRY(mt_all_reduce(t->dp_group, &loss, &loss, 1, MT_F32, MT_REDUCE_AVG, NULL));
    /* A GPU may still run the optimizer step: the step ends when the device is idle. */
    MT_TRY(mt_device_synchronize(mt_runtime_device(t->rt)));
    double ms = now_ms() - t0;
    uint64_t peaks[MEM_FIELDS], host[MEM_FIELDS];
    MT_TRY(gather_peaks(t, peaks, host));
    if (t->rank != 0) return MT_OK;
    for (int i = 0; i < MEM_FIELDS; i++) {
        if (peaks[i] > t->measured[i]) t->measured[i] = peaks[i];
        if (host[i] > t->measured_host[i]) t->measured_host[i] = host[i];
    }

    double tokens = (double)o->dp * o->batch * o->grad_accum * o->seq;
    double tps = tokens / (ms / 1e3);
    double mfu = t->peak_flops > 0.0 ? tps * t->flops_per_token / t->peak_flops : NAN;
    if (step > t->first_step) { /* the first step pays for warm-up (caches, NCCL, ...) */
        t->timed_ms += ms;
        t->timed_tokens += tokens;
    }
    char peak[32], mfu_text[32] = "";
    if (isfinite(mfu)) snprintf(mfu_text, sizeof mfu_text, " | MFU %5.1f%%", mfu * 100.0);
    printf("step %5d | loss %.4f | lr %.2e | grad norm %.4f | %8.1f ms | %9.0f tok/s%s | "
           "peak %s\n",
           step, (double)loss, (double)lr, (double)norm, ms, tps, mfu_text,
           mt_format_bytes((size_t)peaks[MEM_FIELDS - 1], peak, sizeof peak));
    fflush(stdout);
    t->step_losses[step] = loss;
    if (t->metrics) write_step_metrics(t, step, loss, lr, norm, ms, tps, mfu, peaks, host);
    return MT_OK;
}

/* Rank 0, at the end: the loss at steps 0, 25%, 50%, 75% and the last, each the mean over the
 * (up to) CURVE_WINDOW steps ending there, since one step's loss is one batch's and noisy. */
#define CURVE_WINDOW 10
static void print_loss_curve(const trainer *t) {
    int n = t->opt->steps, first = t->first_step;
    if (n <= first) return;
    printf("loss curve (mean of the %d steps up to each):", CURVE_WINDOW);
    int last_shown = -1;
    for (int q = 0; q <= 4; q++) {
        int s = first + (int)((long)(n - 1 - first) * q / 4);
        if (s == last_shown) continue;
        last_shown = s;
        int from = s + 1 - first > CURVE_WINDOW ? s + 1 - CURVE_WINDOW : first;
        double sum = 0.0;
        for (int i = from; i <= s; i++) sum += t->step_losses[i];
        printf("%s step %d %.4f", q ? " |" : "", s, sum / (s + 1 - from));
    }
    /* The loss of a uniform guess over the vocabulary, where training starts. */
    printf("  (ln %d = %.4f)\n", t->opt->vocab, log((double)t->opt->vocab));
}

/* Rank 0, at the end: what its tp or dp group's collectives moved in the last step (payloads,
 * as mt_group_counters counts them), to compare tensor-parallel layouts and FSDP's resharding
 * (docs/benchmarks.md). */
static void print_traffic(const char *dim, const mt_comm_counters *c) {
    printf("%s traffic (rank 0, last step):", dim);
    for (int k = 0; k < MT_COLL_KINDS; k++)
        printf("%s %s %llu calls %llu B", k ? " |" : "", mt_coll_kind_name((mt_coll_kind)k),
               (unsigned long long)c->calls[k], (unsigned long long)c->bytes[k]);
    printf("\n");
}

static mt_status train(trainer *t) {
    const options *o = t->opt;
    /* Before anything is allocated: a configuration that cannot fit is said so first. */
    MT_TRY(predict_memory(t));
    if (o->predict_only) return MT_OK;
    MT_TRY(build(t));
    uint64_t setup[MEM_FIELDS], setup_host[MEM_FIELDS];
    MT_TRY(gather_peaks(t, setup, setup_host));
    t->measured_setup = setup[MEM_FIELDS - 1];
    setup_mfu(t);
    MT_TRY(print_summary(t));
    if (o->resume_path[0]) MT_TRY(resume(t));
    mt_module *root = mt_gpt_root(t->gpt);
    for (int step = t->first_step; step <= o->steps; step++) {
        bool eval_now = o->eval_every > 0 && (step % o->eval_every == 0 || step == o->steps);
        if (eval_now) MT_TRY(evaluate(t, step));
        if (step == o->steps) break;
        MT_TRY(train_step(t, step));
        if (o->save_every > 0 && ((step + 1) % o->save_every == 0 || step + 1 == o->steps))
            MT_TRY(save_checkpoint(t, step + 1));
    }
    if (o->save_every > 0 && o->steps > t->first_step) {
        /* The last save must be on disk before the program ends. */
        mt_checkpoint_stats cs;
        MT_TRY(mt_checkpoint_stats_get(root, &cs));
        if (t->rank == 0) {
            printf(PROG ": last checkpoint step-%08ld committed: rank 0 wrote %.1f MB in %.3f s "
                   "(stall %.1f ms)\n", cs.step, (double)cs.bytes / 1e6, cs.write_s,
                   cs.stall_s * 1e3);
            fflush(stdout);
        }
    }
    if (t->rank == 0) {
        char report[1024];
        print_loss_curve(t);
        if (t->timed_ms > 0.0) {
            double tps = t->timed_tokens / (t->timed_ms / 1e3);
            printf("throughput (steps 1..%d, after the first): %.0f tok/s", o->steps - 1, tps);
            if (t->peak_flops > 0.0)
                printf(", MFU %.1f%% (%.4g of %.4g TFLOP/s)",
                       100.0 * tps * t->flops_per_token / t->peak_flops,
                       tps * t->flops_per_token / 1e12, t->peak_flops / 1e12);
            printf("\n");
        }
        if (o->steps > t->first_step) print_memory_comparison(t);
        if (o->steps > t->first_step) {
            print_traffic("tp", &t->tp_traffic);
            print_traffic("dp", &t->dp_traffic);
        }
        if (o->offload_overlap && o->steps > t->first_step)
            printf("offload overlap (rank 0, last step): %ld of %zu units stepped while the "
                   "backward ran\n", mt_adamw_overlapped_units(t->adam),
                   mt_adamw_unit_count(t->adam));
        printf("memory (rank 0, last step):\n%s\n",
               mt_memory_report(mt_runtime_device(t->rt), report, sizeof report));
        fflush(stdout);
    }
    return MT_OK;
}

/* Every rank checks its arguments, data file and (rank 0) metrics file, then all agree: if any
 * rank failed, the lowest failing rank prints its message and every rank exits non-zero, rather
 * than the healthy ranks waiting in a collective for the failed one. */
static mt_status agree_on_errors(trainer *t, const char *err) {
    size_t n = (size_t)t->world_size;
    float mine = err[0] ? 1.0f : 0.0f, *all = calloc(n, sizeof *all);
    if (!all) return fail_here(t, MT_ERR_OUT_OF_MEMORY, "no memory to agree on the arguments");
    mt_status st = mt_all_gather(t->world, &mine, all, 1, MT_F32, NULL);
    int first = -1;
    for (size_t r = 0; st == MT_OK && r < n && first < 0; r++)
        if (all[r] != 0.0f) first = (int)r;
    free(all);
    if (st != MT_OK) return st;
    if (first < 0) return MT_OK;
    if (first == t->rank) {
        fprintf(stderr, PROG ": %s\n", err);
        fflush(stderr);
    }
    /* The message is out before anyone exits (a launcher stops the job at the first exit). */
    (void)mt_barrier(t->world, NULL);
    mt_clear_error();
    return MT_ERR_INVALID_ARG;
}

int main(int argc, char **argv) {
    options opt;
    char err[ERR_CAP] = "";
    int parsed = parse_args(argc, argv, &opt, err);
    if (parsed == 1) {
        fputs(usage, stdout);
        return 0;
    }
    /* --device picks the device mt_init opens; without it MT_DEVICE (default auto) decides. */
    if (parsed == 0 && opt.device) setenv("MT_DEVICE", opt.device, 1);

    trainer t = {.opt = &opt};
    mt_status st = mt_init(&t.rt, &argc, &argv);
    if (st != MT_OK) {
        fprintf(stderr, PROG ": %s\n", mt_last_error());
        if (t.rt) mt_finalize(t.rt);
        return 1;
    }
    t.rank = mt_runtime_rank(t.rt);
    t.world_size = mt_runtime_world_size(t.rt);
    t.world = mt_runtime_world(t.rt);
    if (!err[0]) resolve_resume(&opt, err);
    if (!err[0]) check_shape(&opt, t.world_size, err);
    if (!err[0]) load_data(&opt, &t.data, err);
    if (!err[0] && t.rank == 0 && opt.metrics && !(t.metrics = fopen(opt.metrics, "w")))
        fail_msg(err, "cannot write metrics file '%s': %s", opt.metrics, strerror(errno));

    /* Exit 2: bad arguments or inputs, found before training; 1: a failure while training. */
    int code = 2;
    st = agree_on_errors(&t, err);
    if (st == MT_OK) {
        code = 1;
        st = train(&t);
    }
    if (st != MT_OK && mt_last_error()[0]) fprintf(stderr, PROG ": %s\n", mt_last_error());

    if (t.metrics) fclose(t.metrics);
    if (t.adam) mt_adamw_destroy(t.adam);
    if (t.gpt) mt_gpt_destroy(t.gpt);
    if (t.mesh) mt_mesh_destroy(t.mesh);
    free(t.tokens);
    free(t.step_losses);
    free(t.data.ids);
    mt_finalize(t.rt);
    if (st == MT_OK && opt.predict_only && !t.predicted_fits) return 3;
    return st == MT_OK ? 0 : code;
}
