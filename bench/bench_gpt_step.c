/* mt-bench-gpt-step: what the engine costs in a GPT training step, next to the ops it runs and
 * the hardware's matrix-product peak, all measured in one run.
 *
 *   mtrun --nproc_per_node N mt-bench-gpt-step [--layers 12] [--d-model 768] [--heads 12]
 *         [--vocab 256] [--seq 64] [--global-batch 4] [--rounds 5] [--bf16-step] [--json]
 *
 * The ranks form a {"dp": N, "tp": 1} mesh and each takes global-batch / N sequences (the same
 * global batch at every N, as train_gpt's figures in docs/benchmarks.md). Measured per round,
 * each on every rank at once (the ranks share the cores as in training), the phases interleaved
 * so that a busy moment of the machine hits them alike:
 *   ops    the GPT's forward and backward (mt_gpt_forward_backward on a second, unsharded copy of
 *          the model: its module functions with no FSDP hooks, so the same mt_op_* and tp calls
 *          on plain buffers, no second copy of the model's math), then the optimizer's ops on
 *          this rank's shard sizes (sum of squares for clipping, the clip's scaling when the
 *          engine's last step clipped, AdamW per unit);
 *   comm   the collectives of one step, without compute, on buffers allocated once: per FSDP unit
 *          (sizes from the units) an all-gather in forward, an all-gather (blocks) and a
 *          reduce-scatter in backward, each waited for before the next (a barrier instead of
 *          each all-gather of a unit whose gathers the engine maps); then the clip's and the
 *          loss's one-value all-reduces;
 *   step   train_gpt's step through the engine: mt_gpt_forward_backward on the sharded model,
 *          mt_clip_grad_norm, mt_adamw_step, mt_zero_grad, the loss all-reduce.
 * Engine overhead = step - ops - exposed communication, where exposed communication is the time
 * the step's thread spent blocked on FSDP's collectives (the units' wait_s, fsdp_internal.h,
 * which also holds clipping's all-reduces of the squared norm) and on the loss all-reduce; at 1
 * rank the collectives are copies and count as engine (exposed = 0). Overheads are per rank and
 * the slowest rank's is reported; the other wall-clock figures are the slowest rank's too.
 * Before the rounds every rank times sgemm 2048^3 on its thread count (best of a few, the better
 * of the pool's product and OpenBLAS's own threads, all ranks at once): the model's FLOP/s
 * (6N + 12LCT per token, as train_gpt counts) is given as a fraction of the ranks' summed peak.
 * Medians over --rounds after one warm-up step.
 * Ops and step are also taken in CPU time (every thread of the process, all from the rank whose
 * step took the most): on a machine that other jobs share, wall-clock differences of a few
 * percent drown in waiting for a core, while CPU time counts the work. The communication
 * thread's own CPU clock (mt_progress_cpu_s) is read over the step too: its copies and sums are
 * the collectives' work, and step - ops - that is the engine's own CPU time (with whatever the
 * ops lose to sharing cores and caches with that thread). On cores that the ranks' compute
 * already fills, what that thread runs while the compute threads have work is taken from them:
 * the wall-clock overhead above counts it, the CPU-time split tells it from the engine's. Page
 * faults of the ops and the step are counted too (the most of any rank).
 * --reshard-after-forward 0|1 shards the engine's model as train_gpt's option does.
 * --bf16-step adds a second engine model, the same GPT sharded with bf16 parameters (train_gpt's
 * --param-dtype bf16: gathered and multiplied in bf16, core/cpu/ops_bf16.c), whose step is timed
 * in every round right after the f32 one: the bf16 step's median and its ratio to the f32 step's,
 * both from the same run (docs/benchmarks.md, "bf16 products").
 */
#include "core/cpu/ops_cpu.h"
#include "core/error.h"
#include "core/thread_name.h"
#include "core/thread_pool.h"
#include "comm/group.h"
#include "comm/progress.h"
#include "fsdp/fsdp_internal.h"
#include "fsdp/fsdp_shards.h"
#include "module/module_internal.h"

#include <meshtrain/meshtrain.h>

#include <cblas.h>
#include <ctype.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define PROG "mt-bench-gpt-step"
#define GEMM_N 2048
#define GEMM_REPS 3
#define CLIP 1.0f /* train_gpt's default --clip */

typedef struct options {
    int layers, d_model, heads, vocab, seq, global_batch, rounds;
    int reshard; /* --reshard-after-forward: 0, 1, or -1 (FSDP's default: the blocks only) */
    int mapped_gather; /* --mapped-gather 0|1 (mt_fsdp_options.mapped_gather; default 1) */
    bool json, bf16_step;
} options;

static const char usage[] =
    "usage: mtrun --nproc_per_node N " PROG " [options]\n"
    "  --layers N        transformer blocks (12)\n"
    "  --d-model N       channels (768)\n"
    "  --heads N         attention heads (12)\n"
    "  --vocab N         vocabulary (256)\n"
    "  --seq N           tokens per sequence (64)\n"
    "  --global-batch N  sequences per step over all ranks, divisible by the ranks (4)\n"
    "  --rounds N        timed rounds, the median is reported (5)\n"
    "  --reshard-after-forward 0|1\n"
    "                    as train_gpt's: 0 keeps every unit gathered from its forward to its\n"
    "                    backward (one all-gather per unit), 1 regathers the root too (default:\n"
    "                    the blocks regather, the root keeps its parameters)\n"
    "  --mapped-gather 0|1\n"
    "                    as train_gpt's: 1 (default) gathers large units by mapping every\n"
    "                    rank's shard (one host), 0 copies them as an all-gather\n"
    "  --bf16-step       also time the step of the model with bf16 parameters, and the ratio\n"
    "  --json            one JSON object on stdout instead of the table\n";

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.layers = 12, .d_model = 768, .heads = 12, .vocab = 256, .seq = 64,
                   .global_batch = 4, .rounds = 5, .reshard = -1, .mapped_gather = 1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") || !strcmp(argv[i], "--bf16-step")) {
            *(argv[i][2] == 'j' ? &o->json : &o->bf16_step) = true;
            continue;
        }
        if (!strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return 1;
        }
        int *dst = !strcmp(argv[i], "--layers")         ? &o->layers
                   : !strcmp(argv[i], "--d-model")      ? &o->d_model
                   : !strcmp(argv[i], "--heads")        ? &o->heads
                   : !strcmp(argv[i], "--vocab")        ? &o->vocab
                   : !strcmp(argv[i], "--seq")          ? &o->seq
                   : !strcmp(argv[i], "--global-batch") ? &o->global_batch
                   : !strcmp(argv[i], "--rounds")       ? &o->rounds
                   : !strcmp(argv[i], "--reshard-after-forward") ? &o->reshard
                   : !strcmp(argv[i], "--mapped-gather")         ? &o->mapped_gather
                                                                 : NULL;
        char *end = NULL;
        long v = dst && i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
        bool flag = dst == &o->reshard || dst == &o->mapped_gather;
        long lo = flag ? 0 : 1, hi = flag ? 1 : 1 << 24;
        /* Digits only: strtol would take "", " 1" and "+0". */
        bool digits = dst && i + 1 < argc && isdigit((unsigned char)argv[i + 1][0]);
        if (!dst || !digits || !end || *end || v < lo || v > hi) {
            fprintf(stderr, PROG ": bad option %s (integer options take a value in 1..%d; "
                    "--reshard-after-forward and --mapped-gather 0 or 1)\n%s",
                    argv[i], 1 << 24, usage);
            return -1;
        }
        *dst = (int)v;
        i++;
    }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The CPU time of every thread of the process (the BLAS's and the comm progress thread's too):
 * on a machine whose cores other jobs share it moves far less than the wall clock, so that the
 * engine's own work can be told apart from waiting for a core. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Page faults of the process so far (minor and major, every thread): a step in steady state
 * should take none (issue 20: the CPU device's block cache keeps its buffers mapped). */
static double faults(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)(ru.ru_minflt + ru.ru_majflt) : 0.0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- the sgemm peak -------------------------------------------------------------------------- */

/* GFLOP/s of the best of GEMM_REPS sgemm GEMM_N^3 on the rank's threads, after one untimed call,
 * the better of two ways: the CPU device's product (core/cpu/ops_gemm.c: blocks that the pool's
 * threads hand to OpenBLAS at 1 thread, as the model's products run) and one cblas_sgemm call on
 * OpenBLAS's own threads, as many as the pool's (set back to 1 after). The better one is the
 * BLAS's peak the model is measured against: a fraction of the slower would flatter it. */
static mt_status sgemm_peak(int threads, double *gflops) {
    size_t nn = (size_t)GEMM_N * GEMM_N;
    float *a = malloc(nn * sizeof *a), *b = malloc(nn * sizeof *b), *c = malloc(nn * sizeof *c);
    if (!a || !b || !c) {
        free(a);
        free(b);
        free(c);
        return mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": out of host memory for three %d x %d "
                        "matrices", GEMM_N, GEMM_N);
    }
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)(i % 17) * 0.01f;
        b[i] = (float)(i % 13) * 0.01f;
    }
    double best = 1e30;
    mt_status st = MT_OK;
    for (int way = 0; way < 2 && st == MT_OK; way++) {
        if (way == 1) openblas_set_num_threads(threads);
        for (int r = 0; r <= GEMM_REPS && st == MT_OK; r++) {
            double t0 = now_s();
            if (way == 0)
                st = mt_cpu_op_gemm(false, false, GEMM_N, GEMM_N, GEMM_N, 1.0f, a, b, 0.0f, c);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, GEMM_N, GEMM_N, GEMM_N,
                            1.0f, a, GEMM_N, b, GEMM_N, 0.0f, c, GEMM_N);
            double dt = now_s() - t0;
            if (r > 0 && dt < best) best = dt;
        }
        if (way == 1) openblas_set_num_threads(1); /* as the pool set it */
    }
    free(a);
    free(b);
    free(c);
    if (st != MT_OK) return mt_error_wrap(st, PROG ": the sgemm peak's product");
    *gflops = 2.0 * GEMM_N * (double)GEMM_N * GEMM_N / best / 1e9;
    return MT_OK;
}

/* ---- the two models -------------------------------------------------------------------------- */

typedef struct bench {
    const options *o;
    mt_runtime *rt;
    mt_device *dev;
    mt_group *world, *dp;
    mt_mesh *mesh;
    int rank, nranks, batch;
    int *tokens; /* batch x (seq + 1) */
    /* The engine's model, sharded as train_gpt shards it, and its optimizer. */
    mt_gpt *gpt;
    mt_adamw *adam;
    /* --bf16-step: the same model with bf16 parameters, and its optimizer. */
    mt_gpt *gpt16;
    mt_adamw *adam16;
    size_t *unit_n; /* each unit's shard elements, mt_fsdp_collect_shards order */
    bool *unit_mapped; /* and whether its gathers map the ranks' shards (a barrier, no data) */
    size_t n_units, shard_total, unit_max;
    /* The ops' model: unsharded, its gradients plain buffers, and the optimizer's buffers. */
    mt_gpt *plain;
    float *plain_grads;
    float *opt_p, *opt_g, *opt_m, *opt_v;
    double *sumsq;
    float last_norm; /* the engine's last gradient norm: the ops pass clips when it clipped */
    /* The collectives' buffers. */
    float *c_shard, *c_full;
} bench;

static mt_status dev_zeros(mt_device *dev, size_t elems, float **out) {
    size_t bytes = (elems ? elems : 1) * sizeof(float);
    MT_TRY(mt_device_alloc(dev, bytes, MT_MEM_OTHER, (void **)out));
    return mt_device_memset(dev, *out, 0, bytes, NULL);
}

static mt_gpt_config model_config(const options *o, bool defer) {
    return (mt_gpt_config){.layers = o->layers, .d_model = o->d_model, .heads = o->heads,
                           .seq = o->seq, .vocab = o->vocab, .seed = 1, .defer_init = defer};
}

/* An engine's model: every block, then the root, sharded over dp with parameters of dtype,
 * values from the seed, AdamW on the shards (train_gpt's defaults). */
static mt_status sharded_model(bench *b, mt_dtype dtype, mt_gpt **gpt, mt_adamw **adam) {
    mt_gpt_config cfg = model_config(b->o, true);
    MT_TRY(mt_gpt_create(b->mesh, &cfg, gpt));
    mt_fsdp_options fo = mt_fsdp_defaults(b->mesh, "dp");
    fo.param_dtype = dtype;
    fo.reshard_after_forward = b->o->reshard;
    fo.mapped_gather = b->o->mapped_gather != 0;
    for (int l = 0; l < b->o->layers; l++) MT_TRY(mt_fsdp_shard(mt_gpt_block(*gpt, l), &fo));
    mt_module *root = mt_gpt_root(*gpt);
    MT_TRY(mt_fsdp_shard(root, &fo));
    MT_TRY(mt_module_init_params(root));
    mt_adamw_options ao = {.lr = 1e-3f, .weight_decay = 0.0f};
    return mt_adamw_create(root, &ao, adam);
}

/* The engine's model (f32) and, with --bf16-step, its bf16 twin; the f32 one's unit sizes. */
static mt_status engine_model(bench *b) {
    MT_TRY(sharded_model(b, MT_F32, &b->gpt, &b->adam));
    if (b->o->bf16_step) MT_TRY(sharded_model(b, MT_BF16, &b->gpt16, &b->adam16));
    mt_module *root = mt_gpt_root(b->gpt);
    mt_fsdp_shard_view *views = NULL;
    MT_TRY(mt_fsdp_collect_shards(root, &views, &b->n_units));
    /* The same units in the same order (mt_fsdp_collect_shards lists mt_fsdp_units_below's). */
    mt_fsdp_unit **units = NULL;
    size_t n_units = 0;
    mt_status st = mt_fsdp_units_below(root, &units, &n_units);
    if (st != MT_OK || n_units != b->n_units) {
        free(views);
        free(units);
        return st != MT_OK ? st
                           : mt_error(MT_ERR_INTERNAL, PROG ": %zu shard views, %zu units",
                                      b->n_units, n_units);
    }
    b->unit_n = calloc(b->n_units + 1, sizeof *b->unit_n);
    b->unit_mapped = calloc(b->n_units + 1, sizeof *b->unit_mapped);
    if (!b->unit_n || !b->unit_mapped) {
        free(views);
        free(units);
        return mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": out of host memory for %zu unit sizes",
                        b->n_units);
    }
    for (size_t u = 0; u < b->n_units; u++) {
        b->unit_n[u] = views[u].n;
        b->unit_mapped[u] = units[u]->view != NULL;
        b->shard_total += views[u].n;
        if (views[u].n > b->unit_max) b->unit_max = views[u].n;
    }
    free(views);
    free(units);
    return MT_OK;
}

/* Points every parameter of m's subtree at its slice of the plain gradient buffer from *at on. */
static void point_plain_grads(mt_module *m, float *grads, size_t *at) {
    for (size_t i = 0; i < mt_module_param_count(m); i++) {
        mt_param *p = mt_module_param(m, i);
        p->grad = grads + *at;
        *at += mt_param_numel(p);
    }
    for (size_t i = 0; i < m->n_children; i++) point_plain_grads(m->children[i], grads, at);
}

/* Marks the plain gradients as holding nothing, as FSDP hands out its full gradient buffers, so
 * that the model's backward runs the same ops as in the engine's step: the first write of each
 * gradient overwrites (module.h, mt_param_grad_write). */
static void unwrite_plain_grads(mt_module *m) {
    for (size_t i = 0; i < mt_module_param_count(m); i++)
        mt_module_param(m, i)->grad_unwritten = true;
    for (size_t i = 0; i < m->n_children; i++) unwrite_plain_grads(m->children[i]);
}

static size_t subtree_numel(const mt_module *m) {
    size_t n = 0;
    for (size_t i = 0; i < mt_module_param_count(m); i++)
        n += mt_param_numel(mt_module_param(m, i));
    for (size_t i = 0; i < m->n_children; i++) n += subtree_numel(m->children[i]);
    return n;
}

/* The ops' model: the same GPT, not sharded, so that its forward and backward run the model's
 * functions with no hook around them; the gradients the backward adds into are plain buffers
 * (what FSDP's full gradient buffers are in the engine). */
static mt_status plain_model(bench *b) {
    mt_gpt_config cfg = model_config(b->o, false);
    MT_TRY(mt_gpt_create(b->mesh, &cfg, &b->plain));
    mt_module *root = mt_gpt_root(b->plain);
    size_t total = subtree_numel(root), at = 0;
    MT_TRY(dev_zeros(b->dev, total, &b->plain_grads));
    point_plain_grads(root, b->plain_grads, &at);
    size_t n = b->shard_total;
    MT_TRY(dev_zeros(b->dev, n, &b->opt_p));
    MT_TRY(dev_zeros(b->dev, n, &b->opt_g));
    MT_TRY(dev_zeros(b->dev, n, &b->opt_m));
    MT_TRY(dev_zeros(b->dev, n, &b->opt_v));
    MT_TRY(mt_device_alloc(b->dev, sizeof(double), MT_MEM_OTHER, (void **)&b->sumsq));
    return mt_device_memset(b->dev, b->sumsq, 0, sizeof(double), NULL);
}

static void bench_free(bench *b) {
    if (b->plain) {
        /* Not the model's own buffers: the gradients go back to NULL before it is destroyed. */
        size_t at = 0;
        point_plain_grads(mt_gpt_root(b->plain), NULL, &at);
    }
    mt_gpt_destroy(b->plain);
    float *bufs[] = {b->plain_grads, b->opt_p, b->opt_g, b->opt_m, b->opt_v, b->c_shard,
                     b->c_full};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) mt_device_free(b->dev, bufs[i]);
    mt_device_free(b->dev, b->sumsq);
    if (b->adam) mt_adamw_destroy(b->adam);
    mt_gpt_destroy(b->gpt);
    if (b->adam16) mt_adamw_destroy(b->adam16);
    mt_gpt_destroy(b->gpt16);
    free(b->unit_n);
    free(b->unit_mapped);
    free(b->tokens);
    mt_mesh_destroy(b->mesh);
}

/* ---- the timed phases ------------------------------------------------------------------------ */

static mt_status ops_pass(bench *b) {
    float loss;
    unwrite_plain_grads(mt_gpt_root(b->plain));
    MT_TRY(mt_gpt_forward_backward(b->plain, b->tokens, b->batch, 1.0f, &loss));
    /* The optimizer's compute on this rank's shards: clipping's sum of squares, AdamW per unit
     * (the engine adds the reduced gradient into its shard and zeroes it too: that is engine). */
    MT_TRY(mt_op_sum_squares(b->dev, b->opt_g, b->shard_total, b->sumsq));
    /* The clipping factor: on the CPU device the engine multiplies it inside AdamW as the step
     * reads the gradients (mt_fsdp_scale_grads), elsewhere a pass of mt_op_scale. */
    float clip = b->last_norm > CLIP ? CLIP / b->last_norm : 1.0f;
    bool on_cpu = mt_device_get_kind(b->dev) == MT_DEVICE_CPU;
    if (clip != 1.0f && !on_cpu) MT_TRY(mt_op_scale(b->dev, b->opt_g, clip, b->shard_total));
    size_t at = 0;
    for (size_t u = 0; u < b->n_units; u++) {
        float *p = b->opt_p + at, *g = b->opt_g + at, *m = b->opt_m + at, *v = b->opt_v + at;
        MT_TRY(on_cpu ? mt_cpu_op_adamw_scaled(p, g, clip, m, v, b->unit_n[u], 1, 1e-3f, 0.9f,
                                               0.999f, 1e-8f, 0.0f)
                      : mt_op_adamw(b->dev, p, g, m, v, b->unit_n[u], 1, 1e-3f, 0.9f, 0.999f,
                                    1e-8f, 0.0f));
        at += b->unit_n[u];
    }
    return MT_OK;
}

/* Unit u's gather as the engine does it: an all-gather of its shard, or a barrier where the
 * engine maps the ranks' shards (mt_fsdp_options.mapped_gather). */
static mt_status gather(bench *b, size_t u) {
    if (b->unit_mapped[u]) return mt_barrier(b->dp, NULL);
    return mt_all_gather(b->dp, b->c_shard, b->c_full, b->unit_n[u], MT_F32, NULL);
}

/* FSDP's order: the root's gather, the blocks' in forward; in backward the root gathered again
 * first (only with --reshard-after-forward 1: its pre-backward hook), then each block gathered
 * again (unless --reshard-after-forward 0 kept it) and its gradients reduce-scattered, last block
 * first, then the root's reduce-scatter; the units are listed blocks first, root last. */
static mt_status comm_pass(bench *b) {
    size_t root = b->n_units - 1;
    bool regather_blocks = b->o->reshard != 0, regather_root = b->o->reshard == 1;
    MT_TRY(gather(b, root));
    for (size_t u = 0; u < root; u++) MT_TRY(gather(b, u));
    if (regather_root) MT_TRY(gather(b, root));
    for (size_t u = root; u-- > 0;) {
        if (regather_blocks) MT_TRY(gather(b, u));
        MT_TRY(mt_reduce_scatter(b->dp, b->c_full, b->c_shard, b->unit_n[u], MT_F32,
                                 MT_REDUCE_AVG, NULL));
    }
    MT_TRY(mt_reduce_scatter(b->dp, b->c_full, b->c_shard, b->unit_n[root], MT_F32,
                             MT_REDUCE_AVG, NULL));
    float v = 1.0f;
    MT_TRY(mt_all_reduce(b->dp, &v, &v, 1, MT_F32, MT_REDUCE_SUM, NULL));
    return mt_all_reduce(b->dp, &v, &v, 1, MT_F32, MT_REDUCE_AVG, NULL);
}

/* Seconds every unit of the engine's model has waited for its collectives so far. */
/* One training step of gpt; *norm gets the gradient norm, *t_reduce when the loss's all-reduce
 * began. */
static mt_status train_step(bench *b, mt_gpt *gpt, mt_adamw *adam, float *norm,
                            double *t_reduce) {
    mt_module *root = mt_gpt_root(gpt);
    float loss;
    MT_TRY(mt_gpt_forward_backward(gpt, b->tokens, b->batch, 1.0f, &loss));
    MT_TRY(mt_clip_grad_norm(root, CLIP, norm));
    MT_TRY(mt_adamw_step(adam));
    MT_TRY(mt_zero_grad(root));
    *t_reduce = now_s();
    return mt_all_reduce(b->dp, &loss, &loss, 1, MT_F32, MT_REDUCE_AVG, NULL);
}

static double fsdp_wait_s(bench *b) {
    double s = 0.0;
    mt_fsdp_debug d;
    for (int l = 0; l <= b->o->layers; l++) {
        mt_module *m = l < b->o->layers ? mt_gpt_block(b->gpt, l) : mt_gpt_root(b->gpt);
        if (mt_fsdp_debug_get(m, &d) == MT_OK) s += d.wait_s;
    }
    return s;
}

/* train_gpt's step (examples/train_gpt.c, train_step) on the f32 model; *exposed gets the
 * seconds it waited for communication. */
static mt_status engine_step(bench *b, double *exposed) {
    double w0 = fsdp_wait_s(b), t0 = 0.0;
    float norm;
    MT_TRY(train_step(b, b->gpt, b->adam, &norm, &t0));
    b->last_norm = norm;
    *exposed = fsdp_wait_s(b) - w0 + (now_s() - t0);
    return MT_OK;
}

enum { T_OPS, T_COMM, T_STEP, T_EXPOSED, T_OVERHEAD, T_OPS_CPU, T_STEP_CPU, T_OVERHEAD_CPU,
       T_STEP_COMM_CPU, T_ENGINE_CPU, T_OPS_FAULTS, T_STEP_FAULTS, T_BF16_STEP, T_BF16_STEP_CPU,
       T_COUNT };
static const char *const t_names[T_COUNT] = {"ops_ms", "comm_ms", "step_ms", "exposed_comm_ms",
                                             "overhead_ms", "ops_cpu_ms", "step_cpu_ms",
                                             "overhead_cpu_ms", "step_comm_thread_cpu_ms",
                                             "engine_cpu_ms", "ops_page_faults",
                                             "step_page_faults", "bf16_step_ms",
                                             "bf16_step_cpu_ms"};

/* The CPU seconds the communication progress thread behind the dp group has run (it exists at
 * every rank count: even one rank's collectives are its copies). */
static mt_status comm_thread_cpu_s(bench *b, double *s) {
    *s = mt_progress_cpu_s(b->dp->tr);
    if (*s < 0.0)
        return mt_error(MT_ERR_INTERNAL, PROG ": cannot read the communication thread's CPU "
                        "clock (is it still running?)");
    return MT_OK;
}

/* The training thread takes each phase's name while it runs it (measure() restores its own
 * after the rounds), so that a profile of the whole benchmark splits by phase: perf record -a --
 * mtrun ... mt-bench-gpt-step; perf report --sort comm,dso,sym shows gpt-ops, gpt-comm, gpt-step
 * and gpt-bf16-step beside mt-comm (the communication thread). Only that thread: with more than
 * one thread per rank the pool's workers stay mt-pool in every phase. */
static const char *const phase_names[T_STEP + 1] = {"gpt-ops", "gpt-comm", "gpt-step"};

/* The CPU-time figures, from one rank: the one whose step took the most CPU time, so that step
 * - ops = the communication thread's + the engine's own holds in every round (each field's
 * maximum over the ranks could come from a different rank). */
static const int cpu_fields[] = {T_OPS_CPU, T_STEP_CPU, T_OVERHEAD_CPU, T_STEP_COMM_CPU,
                                 T_ENGINE_CPU};

/* Every rank's figures of the round in t: each wall-clock time, page count and the bf16 step's
 * CPU time the largest over the ranks (the slowest rank's), the CPU-time split from one rank
 * (cpu_fields). */
static mt_status combine_ranks(bench *b, const float *mine, double *t) {
    float *all = malloc((size_t)b->nranks * T_COUNT * sizeof *all);
    if (!all) return mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": out of host memory for %d ranks' "
                              "figures", b->nranks);
    mt_status st = mt_all_gather(b->world, mine, all, T_COUNT, MT_F32, NULL);
    if (st == MT_OK) {
        int busiest = 0;
        for (int r = 1; r < b->nranks; r++)
            if (all[r * T_COUNT + T_STEP_CPU] > all[busiest * T_COUNT + T_STEP_CPU]) busiest = r;
        for (int k = 0; k < T_COUNT; k++) {
            float v = all[k];
            for (int r = 1; r < b->nranks; r++)
                if (all[r * T_COUNT + k] > v) v = all[r * T_COUNT + k];
            t[k] = v;
        }
        for (size_t i = 0; i < sizeof cpu_fields / sizeof *cpu_fields; i++)
            t[cpu_fields[i]] = all[busiest * T_COUNT + cpu_fields[i]];
        for (int k = 0; k < T_COUNT; k++)
            if (k != T_OPS_FAULTS && k != T_STEP_FAULTS) t[k] *= 1e3;
    }
    free(all);
    return st;
}

/* One round: each phase on every rank at once, after a barrier; per phase the slowest rank's
 * time, and the slowest rank's overhead (step - ops - exposed, exposed 0 on one rank). */
static mt_status round_times(bench *b, double *t) {
    float mine[T_COUNT] = {0};
    for (int k = T_OPS; k <= T_STEP; k++) {
        MT_TRY(mt_barrier(b->world, NULL));
        mt_name_this_thread(phase_names[k]);
        double p0 = 0.0, p1 = 0.0; /* the communication thread's clock, read around the step */
        if (k == T_STEP) MT_TRY(comm_thread_cpu_s(b, &p0));
        double t0 = now_s(), c0 = cpu_s(), f0 = faults(), exposed = 0.0;
        if (k == T_OPS) MT_TRY(ops_pass(b));
        else if (k == T_COMM) MT_TRY(comm_pass(b));
        else MT_TRY(engine_step(b, &exposed));
        MT_TRY(mt_device_synchronize(b->dev));
        mine[k] = (float)(now_s() - t0);
        if (k == T_STEP) MT_TRY(comm_thread_cpu_s(b, &p1));
        if (k == T_OPS) {
            mine[T_OPS_CPU] = (float)(cpu_s() - c0);
            mine[T_OPS_FAULTS] = (float)(faults() - f0);
        } else if (k == T_STEP) {
            mine[T_STEP_CPU] = (float)(cpu_s() - c0);
            mine[T_STEP_FAULTS] = (float)(faults() - f0);
            mine[T_STEP_COMM_CPU] = (float)(p1 - p0);
            mine[T_EXPOSED] = b->nranks > 1 ? (float)exposed : 0.0f;
        }
    }
    if (b->gpt16) {
        /* Right after the f32 step, so that both meet the machine alike. */
        MT_TRY(mt_barrier(b->world, NULL));
        mt_name_this_thread("gpt-bf16-step");
        double t0 = now_s(), c0 = cpu_s(), t_reduce;
        float norm;
        MT_TRY(train_step(b, b->gpt16, b->adam16, &norm, &t_reduce));
        MT_TRY(mt_device_synchronize(b->dev));
        mine[T_BF16_STEP] = (float)(now_s() - t0);
        mine[T_BF16_STEP_CPU] = (float)(cpu_s() - c0);
    }
    mine[T_OVERHEAD] = mine[T_STEP] - mine[T_OPS] - mine[T_EXPOSED];
    /* In CPU time the step's communication is the progress thread's work, not a wait. */
    mine[T_OVERHEAD_CPU] = mine[T_STEP_CPU] - mine[T_OPS_CPU];
    /* What is left once the communication thread's work (its copies, sums, UCX progress) is
     * taken out too: the engine's own CPU time, with whatever the ops lose to sharing the cores
     * and caches with that thread. */
    mine[T_ENGINE_CPU] = mine[T_OVERHEAD_CPU] - mine[T_STEP_COMM_CPU];
    return combine_ranks(b, mine, t);
}

/* ---- report ---------------------------------------------------------------------------------- */

typedef struct report {
    double med[T_COUNT];
    double gemm_rank_min, gemm_sum; /* GFLOP/s: the slowest rank's peak, the ranks' sum */
    int threads;                    /* the rank's thread count (rank 0's) */
    double flops_per_token, model_gflops;
    size_t params;
} report;

static void print_table(const bench *b, const report *r) {
    const options *o = b->o;
    printf("# " PROG ": GPT %d x %d, %d heads, vocab %d, seq %d, global batch %d (%d per rank), "
           "f32, %zu parameters, reshard after forward: %s\n", o->layers, o->d_model, o->heads,
           o->vocab, o->seq, o->global_batch, b->batch, r->params,
           o->reshard < 0 ? "blocks" : o->reshard ? "all units" : "none");
    printf("# %d rank(s) x %d thread(s); sgemm %d^3: %.1f GFLOP/s per rank (slowest, best of "
           "%d), %.1f all ranks\n", b->nranks, r->threads, GEMM_N, r->gemm_rank_min, GEMM_REPS,
           r->gemm_sum);
    printf("# medians of %d rounds, ms, slowest rank; overhead = step - ops - exposed comm "
           "(1 rank: the copies count as engine)\n", o->rounds);
    printf("# %5s %7s %10s %10s %10s %11s %11s %10s %9s %9s\n", "ranks", "threads", "ops",
           "comm", "step", "exposed", "overhead", "overhd_%", "GFLOP/s", "of_peak_%");
    printf("  %5d %7d %10.2f %10.2f %10.2f %11.2f %11.2f %10.2f %9.1f %9.1f\n", b->nranks,
           r->threads, r->med[T_OPS], r->med[T_COMM], r->med[T_STEP], r->med[T_EXPOSED],
           r->med[T_OVERHEAD], 100.0 * r->med[T_OVERHEAD] / r->med[T_STEP], r->model_gflops,
           100.0 * r->model_gflops / r->gemm_sum);
    printf("# CPU time (all threads of the rank whose step took the most, ms): ops %.2f, "
           "step %.2f, step - ops %.2f (%.2f%% of the step's)\n", r->med[T_OPS_CPU], r->med[T_STEP_CPU],
           r->med[T_OVERHEAD_CPU], 100.0 * r->med[T_OVERHEAD_CPU] / r->med[T_STEP_CPU]);
    if (b->nranks > 1)
        printf("# step - ops = the communication thread (copies, sums, UCX progress) %.2f (%.2f%% "
               "of the step's) + the engine's own CPU time %.2f (%.2f%%), each a median\n",
               r->med[T_STEP_COMM_CPU], 100.0 * r->med[T_STEP_COMM_CPU] / r->med[T_STEP_CPU],
               r->med[T_ENGINE_CPU], 100.0 * r->med[T_ENGINE_CPU] / r->med[T_STEP_CPU]);
    printf("# page faults (the most of any rank): ops %.0f, step %.0f\n",
           r->med[T_OPS_FAULTS], r->med[T_STEP_FAULTS]);
    if (b->gpt16)
        printf("# bf16 parameters: step %.2f ms (CPU %.2f ms); bf16 / f32 step %.3f (CPU time "
               "%.3f)\n", r->med[T_BF16_STEP], r->med[T_BF16_STEP_CPU],
               r->med[T_BF16_STEP] / r->med[T_STEP], r->med[T_BF16_STEP_CPU] / r->med[T_STEP_CPU]);
}

static mt_status print_json(const bench *b, const report *r) {
    const options *o = b->o;
    json_t *j = json_pack("{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:I,s:i,s:f,s:f,s:f,s:f}",
                          "bench", PROG, "ranks", b->nranks, "threads", r->threads, "layers",
                          o->layers, "d_model", o->d_model, "heads", o->heads, "vocab", o->vocab,
                          "seq", o->seq, "global_batch", o->global_batch, "rounds", o->rounds,
                          "params", (json_int_t)r->params, "gemm_n", GEMM_N,
                          "gemm_gflops_rank", r->gemm_rank_min, "gemm_gflops_total", r->gemm_sum,
                          "model_gflops", r->model_gflops, "of_peak",
                          r->model_gflops / r->gemm_sum);
    int shown = b->gpt16 ? T_COUNT : T_BF16_STEP;
    for (int k = 0; j && k < shown; k++) json_object_set_new(j, t_names[k], json_real(r->med[k]));
    if (j && b->gpt16)
        json_object_set_new(j, "bf16_step_ratio", json_real(r->med[T_BF16_STEP] / r->med[T_STEP]));
    if (j) json_object_set_new(j, "reshard_after_forward", json_integer(o->reshard));
    if (j) json_object_set_new(j, "mapped_gather", json_integer(o->mapped_gather));
    if (j) json_object_set_new(j, "overhead_pct", json_real(100.0 * r->med[T_OVERHEAD] /
                                                            r->med[T_STEP]));
    if (j) json_object_set_new(j, "overhead_cpu_pct", json_real(100.0 * r->med[T_OVERHEAD_CPU] /
                                                                r->med[T_STEP_CPU]));
    if (j) json_object_set_new(j, "comm_thread_cpu_pct",
                               json_real(100.0 * r->med[T_STEP_COMM_CPU] / r->med[T_STEP_CPU]));
    if (j) json_object_set_new(j, "engine_cpu_pct", json_real(100.0 * r->med[T_ENGINE_CPU] /
                                                              r->med[T_STEP_CPU]));
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!text) return mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": out of host memory for the report");
    puts(text);
    free(text);
    return MT_OK;
}

/* ---- main ------------------------------------------------------------------------------------ */

static mt_status setup(bench *b) {
    const options *o = b->o;
    b->dev = mt_runtime_device(b->rt);
    b->world = mt_runtime_world(b->rt);
    b->rank = mt_runtime_rank(b->rt);
    b->nranks = mt_runtime_world_size(b->rt);
    if (o->global_batch % b->nranks)
        return mt_error(MT_ERR_INVALID_ARG, PROG ": --global-batch %d does not divide over %d "
                        "ranks", o->global_batch, b->nranks);
    b->batch = o->global_batch / b->nranks;
    MT_TRY(mt_mesh_create(b->rt, 2, (int[]){b->nranks, 1}, (const char *[]){"dp", "tp"},
                          &b->mesh));
    MT_TRY(mt_mesh_group(b->mesh, "dp", &b->dp));
    size_t nt = (size_t)b->batch * (size_t)(o->seq + 1);
    b->tokens = malloc(nt * sizeof *b->tokens);
    if (!b->tokens)
        return mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": out of host memory for %zu tokens", nt);
    for (size_t i = 0; i < nt; i++)
        b->tokens[i] = (int)((i * 2654435761u + (size_t)b->rank * 40503u) % (size_t)o->vocab);
    MT_TRY(engine_model(b));
    MT_TRY(plain_model(b));
    MT_TRY(dev_zeros(b->dev, b->unit_max, &b->c_shard));
    return dev_zeros(b->dev, b->unit_max * (size_t)b->nranks, &b->c_full);
}

static mt_status run(bench *b, report *r) {
    MT_TRY(setup(b));
    const options *o = b->o;
    mt_thread_pool *pool = NULL;
    MT_TRY(mt_thread_pool_get(&pool));
    r->threads = mt_thread_pool_threads(pool);
    /* All ranks at once, as they share the cores in a step. */
    double g = 0.0;
    MT_TRY(mt_barrier(b->world, NULL));
    MT_TRY(sgemm_peak(r->threads, &g));
    float gf[2] = {(float)-g, (float)g}; /* max of -g: the slowest rank's */
    MT_TRY(mt_all_reduce(b->world, gf, gf, 1, MT_F32, MT_REDUCE_MAX, NULL));
    MT_TRY(mt_all_reduce(b->world, gf + 1, gf + 1, 1, MT_F32, MT_REDUCE_SUM, NULL));
    r->gemm_rank_min = -gf[0];
    r->gemm_sum = gf[1];
    /* Warm-up: the engine records its schedule in its first step; both models' buffers and the
     * collectives' paths are touched once. */
    char own_name[16] = "";
    (void)pthread_getname_np(pthread_self(), own_name, sizeof own_name);
    double warm[T_COUNT];
    mt_status st = round_times(b, warm);
    double *t = st == MT_OK ? calloc((size_t)o->rounds * T_COUNT, sizeof *t) : NULL;
    if (st == MT_OK && !t)
        st = mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": out of host memory for %d rounds", o->rounds);
    double one[T_COUNT];
    for (int i = 0; i < o->rounds && st == MT_OK; i++) {
        st = round_times(b, one);
        for (int k = 0; k < T_COUNT; k++) t[(size_t)k * o->rounds + i] = one[k];
    }
    for (int k = 0; k < T_COUNT && st == MT_OK; k++)
        r->med[k] = median(t + (size_t)k * o->rounds, o->rounds);
    free(t);
    if (own_name[0]) mt_name_this_thread(own_name);
    MT_TRY(st);
    r->params = mt_gpt_param_count(b->gpt);
    r->flops_per_token = 6.0 * (double)r->params + 12.0 * o->layers * (double)o->d_model * o->seq;
    r->model_gflops = r->flops_per_token * o->global_batch * o->seq / (r->med[T_STEP] * 1e-3) /
                      1e9;
    return MT_OK;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc != 0) return rc > 0 ? 0 : 2;
    bench b = {.o = &o};
    mt_status st = mt_init(&b.rt, &argc, &argv);
    report r = {0};
    if (st == MT_OK) st = run(&b, &r);
    if (st == MT_OK && b.rank == 0) st = o.json ? print_json(&b, &r) : (print_table(&b, &r), MT_OK);
    if (st != MT_OK) fprintf(stderr, PROG ": %s\n", mt_last_error());
    bench_free(&b);
    if (b.rt) mt_finalize(b.rt);
    return st == MT_OK ? 0 : 1;
}
