/* Tensor-parallel GPT against its single-rank self (run through mtrun, see tp_gpt.cmake).
 *
 *   test_tp [--tp T] [--vocab V] [--bf16] [--tp-dim NAME]
 *           [--sequence-parallel[=keep-gathered]] (--out FILE | --ref FILE)
 *
 * The mesh is {"dp", "tp"} = {world / T, T} ("tp" renamed by --tp-dim); the GPT (layers 2, d_model 16, heads 4, seq 8) is
 * moved off its initialisation by noise defined on the global tensors (so biases and LayerNorm
 * parameters matter), sharded with FSDP over "dp" (each block, then the root) and takes one
 * forward/backward on a global batch of 4 sequences split over dp. Afterwards every parameter's
 * values and gradient are gathered as global tensors: over dp from the FSDP shards
 * (fsdp/fsdp_internal.h), then over tp by the parameter's placement. Replicated parameters (LayerNorms, row-linear biases, wpe)
 * must hold bit-identical gradients on every tp rank. With --out, rank 0 writes loss, values and
 * gradients (the reference, from one rank); with --ref, rank 0 compares against such a file:
 * values bit for bit (the initialisation is defined on global tensors), the loss within relative
 * 1e-5, each gradient within 1e-4 of its tensor's largest magnitude (--bf16: bf16 parameters
 * against the f32 reference, 1e-3 and 2e-2). Also checked on every run:
 * the forward-only loss equals the training loss, activations are all freed after the step, the
 * parameter count, and the configuration errors that name the values. --sequence-parallel turns
 * on the GPT's sequence parallelism (against the same reference, made without it): the same
 * loss and gradients, the replicated LayerNorm gradients (summed over tp from each rank's rows)
 * still identical on every tp rank, and a seq that tp does not divide refused;
 * --sequence-parallel=keep-gathered the same with the column-parallel inputs kept gathered
 * (MT_GPT_SP_KEEP_GATHERED; the activations freed after the step include its kept buffers). A
 * sequence_parallel that is no mode is refused on every run. */
#include "fsdp/fsdp_internal.h"

#include "check.h"
#include "numeric.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LAYERS = 2, D_MODEL = 16, HEADS = 4, SEQ = 8, GLOBAL_BATCH = 4 };
static const uint64_t SEED = 1234;

/* Tolerances against the reference: f32 by default; --bf16 computes with bf16 parameters
 * (mt_fsdp_options.param_dtype) against the f32 reference, which rounds every weight to 8 bits of
 * mantissa, and the linears' inputs and output gradients too (bf16 products, f32 accumulation):
 * losses move by ~3e-5 relative, gradients by up to ~1.3% of their largest (measured; ~0.6% when
 * only the weights were rounded). */
static double loss_tol = 1e-5, grad_tol = 1e-4;
static bool use_bf16;
/* The mesh's tensor-parallel dimension (--tp-dim): the model must split over it, whatever its
 * name. */
static const char *tp_dim = MT_TP_DIM_DEFAULT;
static int sequence_parallel; /* an mt_gpt_sp_mode */

typedef struct gtensor {
    char name[96];
    size_t n;
    float *val, *grad;
} gtensor;

typedef struct ctx {
    mt_runtime *rt;
    mt_mesh *mesh;
    mt_group *dp, *tp;
    int rank, tp_size, tp_rank, dp_size, dp_rank;
    gtensor *t;
    size_t nt;
    size_t replicated_ln_checked;
} ctx;

#define TRYC(call)                                                                                 \
    do {                                                                                           \
        mt_status s_ = (call);                                                                     \
        if (s_ != MT_OK) {                                                                         \
            fprintf(stderr, "rank %d: %s failed: %s\n", c->rank, #call, mt_last_error());          \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* ---- gathering global tensors --------------------------------------------------------------- */

/* Rank r's tp-local part (chunk) into the global tensor, by the parameter's placement. */
static void place_chunk(const mt_param *p, int r, const float *chunk, float *global) {
    int nd = mt_param_ndim(p);
    mt_tp_placement pl = mt_param_tp(p);
    int64_t idx[MT_PARAM_MAX_DIMS] = {0};
    size_t n = mt_param_numel(p);
    for (size_t i = 0; i < n; i++) {
        size_t g = 0;
        for (int d = 0; d < nd; d++) {
            int64_t gi = idx[d];
            if (pl.kind == MT_TP_SHARD && pl.dim == d) gi += r * mt_param_local_dim(p, d);
            g = g * (size_t)mt_param_global_dim(p, d) + (size_t)gi;
        }
        global[g] = chunk[i];
        for (int d = nd - 1; d >= 0; d--) {
            if (++idx[d] < mt_param_local_dim(p, d)) break;
            idx[d] = 0;
        }
    }
}

static int gather_param(ctx *c, const char *unit_name, mt_param *p, const float *local_val,
                        const float *local_grad) {
    size_t n = mt_param_numel(p), global_n = 1;
    for (int d = 0; d < mt_param_ndim(p); d++) global_n *= (size_t)mt_param_global_dim(p, d);
    gtensor *t = realloc(c->t, (c->nt + 1) * sizeof *t);
    if (!t) return 1;
    c->t = t;
    t = &c->t[c->nt++];
    snprintf(t->name, sizeof t->name, "%s.%s", unit_name, mt_param_name(p));
    t->n = global_n;
    t->val = calloc(global_n, sizeof(float));
    t->grad = calloc(global_n, sizeof(float));
    float *vals = malloc(n * c->tp_size * sizeof(float));
    float *grads = malloc(n * c->tp_size * sizeof(float));
    if (!t->val || !t->grad || !vals || !grads) return 1;
    TRYC(mt_all_gather(c->tp, local_val, vals, n, MT_F32, NULL));
    TRYC(mt_all_gather(c->tp, local_grad, grads, n, MT_F32, NULL));
    bool replicated = mt_param_tp(p).kind == MT_TP_REPLICATE;
    for (int r = 0; r < c->tp_size; r++) {
        if (replicated && r > 0) {
            /* Replicated parameters: every tp rank computes the same gradient from the same
             * (all-reduced) inputs, so the copies never drift apart. */
            CHECK_MSG(memcmp(grads, grads + r * n, n * sizeof(float)) == 0,
                      "%s: tp rank %d's gradient of the replicated parameter differs from tp "
                      "rank 0's", t->name, r);
            CHECK_MSG(memcmp(vals, vals + r * n, n * sizeof(float)) == 0,
                      "%s: tp rank %d's values of the replicated parameter differ", t->name, r);
            if (strstr(t->name, ".ln_")) c->replicated_ln_checked++;
            continue;
        }
        place_chunk(p, r, vals + r * n, t->val);
        place_chunk(p, r, grads + r * n, t->grad);
    }
    free(vals);
    free(grads);
    return 0;
}

/* Every parameter of one FSDP unit: its shards all-gathered over dp, then over tp. */
static int gather_unit(ctx *c, mt_module *m) {
    mt_fsdp_unit *u = mt_fsdp_unit_of(m);
    if (!u) {
        fprintf(stderr, "module '%s' is not an FSDP unit\n", mt_module_name(m));
        return 1;
    }
    size_t full_n = u->S * (size_t)u->nranks;
    float *v = malloc(full_n * sizeof(float)), *g = malloc(full_n * sizeof(float));
    if (!v || !g) return 1;
    TRYC(mt_all_gather(u->shard, u->master, v, u->S, MT_F32, NULL));
    TRYC(mt_all_gather(u->shard, u->grad_shard, g, u->S, MT_F32, NULL));
    for (size_t i = 0; i < u->n_params; i++) {
        mt_param *p = u->params[i];
        size_t off = mt_fsdp_param_offset(u, i);
        if (gather_param(c, mt_module_name(m), p, v + off, g + off)) return 1;
    }
    free(v);
    free(g);
    return 0;
}

/* ---- moving the model off its initialisation ------------------------------------------------ */

/* Adds noise of +-0.2, a function of the parameter's name and global index, to every tp-local
 * element (not to wte's padding rows): biases become non-zero and LayerNorm gains differ from 1,
 * so that a bias added twice or a gain ignored shows. Before sharding, where values are f32. */
static int perturb_module(ctx *c, mt_module *m, int vocab) {
    for (size_t i = 0; i < mt_module_param_count(m); i++) {
        mt_param *p = mt_module_param(m, i);
        size_t n = mt_param_numel(p), gn = 1;
        for (int d = 0; d < mt_param_ndim(p); d++) gn *= (size_t)mt_param_global_dim(p, d);
        uint64_t key = 0;
        for (const char *s = mt_module_name(m); *s; s++) key = test_mix64(key ^ (uint64_t)*s);
        for (const char *s = mt_param_name(p); *s; s++) key = test_mix64(key ^ (uint64_t)*s);
        float *noise = calloc(gn, sizeof(float)), *chunk = malloc(n * sizeof(float));
        float *local = malloc(n * sizeof(float));
        if (!noise || !chunk || !local) return 1;
        bool wte = strcmp(mt_param_name(p), "wte.weight") == 0;
        for (size_t g = 0; g < gn; g++)
            if (!wte || g / (size_t)D_MODEL < (size_t)vocab)
                noise[g] = (float)(0.2 * ((double)(test_mix64(key + g) >> 11) / 9007199254740992.0 *
                                          2.0 - 1.0));
        /* The inverse of place_chunk: this rank's elements of the global noise. */
        for (size_t k = 0; k < n; k++) chunk[k] = (float)k;
        float *where = calloc(gn, sizeof(float));
        if (!where) return 1;
        for (size_t g = 0; g < gn; g++) where[g] = -1.0f;
        place_chunk(p, c->tp_rank, chunk, where);
        TRYC(mt_param_read_f32(p, local));
        for (size_t g = 0; g < gn; g++)
            if (where[g] >= 0.0f) local[(size_t)where[g]] += noise[g];
        TRYC(mt_device_copy(mt_runtime_device(c->rt), mt_param_data(p), local, n * sizeof(float),
                            MT_COPY_HOST_TO_DEVICE, NULL));
        free(noise);
        free(chunk);
        free(local);
        free(where);
    }
    return 0;
}

/* ---- reference file ------------------------------------------------------------------------- */

static int write_ref(const ctx *c, const char *path, double loss) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return 1;
    }
    fwrite(&loss, sizeof loss, 1, f);
    fwrite(&c->nt, sizeof c->nt, 1, f);
    for (size_t i = 0; i < c->nt; i++) {
        fwrite(c->t[i].name, sizeof c->t[i].name, 1, f);
        fwrite(&c->t[i].n, sizeof c->t[i].n, 1, f);
        fwrite(c->t[i].val, sizeof(float), c->t[i].n, f);
        fwrite(c->t[i].grad, sizeof(float), c->t[i].n, f);
    }
    return fclose(f) == 0 ? 0 : 1;
}

static void compare_tensor(const gtensor *t, const float *rv, const float *rg) {
    CHECK_MSG(memcmp(t->val, rv, t->n * sizeof(float)) == 0,
              "%s: values differ from the single-rank model's (initialisation depends on the "
              "mesh)", t->name);
    double max_ref = 0.0, max_diff = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < t->n; i++) {
        double d = fabs((double)t->grad[i] - rg[i]);
        if (fabs(rg[i]) > max_ref) max_ref = fabs(rg[i]);
        if (d > max_diff) {
            max_diff = d;
            worst = i;
        }
    }
    CHECK_MSG(max_ref > 0.0, "%s: the reference gradient is all zero", t->name);
    CHECK_MSG(max_diff <= grad_tol * max_ref + 1e-9,
              "%s: gradient differs at %zu: %.9g vs %.9g (reference max %.3g)", t->name, worst,
              t->grad[worst], rg[worst], max_ref);
    printf("  %-28s %6zu values, grad max %.3e, max diff %.2e\n", t->name, t->n, max_ref,
           max_diff);
}

static int compare_ref(const ctx *c, const char *path, double loss) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    double ref_loss = 0;
    size_t nt = 0;
    int rc = 0;
    if (fread(&ref_loss, sizeof ref_loss, 1, f) != 1 || fread(&nt, sizeof nt, 1, f) != 1) rc = 1;
    CHECK_MSG(rc == 0 && nt == c->nt, "reference has %zu tensors, this model %zu", nt, c->nt);
    double rel = fabs(loss - ref_loss) / fabs(ref_loss);
    CHECK_MSG(rel <= loss_tol, "loss %.9g vs reference %.9g (relative %.3g > %.3g)", loss,
              ref_loss, rel, loss_tol);
    printf("loss %.9g, reference %.9g, relative difference %.3g\n", loss, ref_loss, rel);
    for (size_t i = 0; rc == 0 && i < nt && i < c->nt; i++) {
        char name[96];
        size_t n = 0;
        if (fread(name, sizeof name, 1, f) != 1 || fread(&n, sizeof n, 1, f) != 1) {
            rc = 1;
            break;
        }
        float *rv = malloc(n * sizeof(float) + 1), *rg = malloc(n * sizeof(float) + 1);
        if (!rv || !rg || fread(rv, sizeof(float), n, f) != n ||
            fread(rg, sizeof(float), n, f) != n)
            rc = 1;
        /* A vocabulary padded to a multiple of tp adds rows to wte that must stay 0. */
        const gtensor *t = &c->t[i];
        bool padded = strcmp(name, "gpt.wte.weight") == 0 && t->n > n &&
                      (t->n - n) % (size_t)D_MODEL == 0;
        bool same = strcmp(name, t->name) == 0 && (n == t->n || padded);
        CHECK_MSG(same, "tensor %zu: reference '%s' (%zu values), this model '%s' (%zu)", i,
                  name, n, t->name, t->n);
        if (rc == 0 && same) {
            gtensor head = *t;
            head.n = n;
            compare_tensor(&head, rv, rg);
            for (size_t k = n; k < t->n; k++)
                CHECK_MSG(t->val[k] == 0.0f && t->grad[k] == 0.0f,
                          "%s: padding element %zu is %g (gradient %g), not 0", name, k,
                          t->val[k], t->grad[k]);
        }
        free(rv);
        free(rg);
    }
    fclose(f);
    CHECK_MSG(rc == 0, "could not read the reference file %s", path);
    return 0;
}

/* ---- configuration errors ------------------------------------------------------------------- */

static void expect_create_error(mt_mesh *mesh, mt_gpt_config cfg, const char *needle) {
    mt_gpt *g = NULL;
    mt_status st = mt_gpt_create(mesh, &cfg, &g);
    CHECK_MSG(st == MT_ERR_INVALID_ARG && g == NULL && strstr(mt_last_error(), needle),
              "expected an error naming '%s', got status %d: %s", needle, (int)st,
              mt_last_error());
    mt_gpt_destroy(g);
}

static void check_config_errors(const ctx *c, const mt_gpt_config *good) {
    mt_gpt_config cfg = *good;
    cfg.seq = 0;
    expect_create_error(c->mesh, cfg, "seq 0");
    cfg = *good;
    cfg.d_model = 18;
    expect_create_error(c->mesh, cfg, "d_model 18 not divisible by heads 4");
    cfg = *good;
    cfg.sequence_parallel = MT_GPT_SP_KEEP_GATHERED + 1;
    expect_create_error(c->mesh, cfg, "sequence_parallel 3 is no mode");
    if (c->tp_size > 1) {
        char want[64];
        cfg = *good;
        cfg.heads = 2 * c->tp_size + 1;
        cfg.d_model = 2 * cfg.heads;
        snprintf(want, sizeof want, "heads %d not divisible by tp %d", cfg.heads, c->tp_size);
        expect_create_error(c->mesh, cfg, want);
        if (sequence_parallel) {
            cfg = *good;
            cfg.seq = 2 * c->tp_size + 1;
            snprintf(want, sizeof want, "sequence parallelism: seq %d not divisible by tp %d",
                     cfg.seq, c->tp_size);
            expect_create_error(c->mesh, cfg, want);
        }
    }
}

static size_t expected_params(const mt_gpt_config *g) {
    size_t C = (size_t)g->d_model;
    size_t block = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C +
                   4 * C * C + C;
    return (size_t)g->vocab * C + (size_t)g->seq * C + 2 * C + (size_t)g->layers * block;
}

/* ---- the run -------------------------------------------------------------------------------- */

static int run(ctx *c, int vocab, const char *out, const char *ref) {
    mt_gpt_config cfg = {.layers = LAYERS, .d_model = D_MODEL, .heads = HEADS, .seq = SEQ,
                         .vocab = vocab, .seed = SEED, .tp_dim = tp_dim,
                         .sequence_parallel = sequence_parallel};
    check_config_errors(c, &cfg);
    mt_gpt *gpt = NULL;
    TRYC(mt_gpt_create(c->mesh, &cfg, &gpt));
    /* Every module splits over the mesh's tp dimension: a Shard parameter holds 1/tp of it. */
    mt_module *block0 = mt_gpt_block(gpt, 0);
    CHECK_MSG(strcmp(mt_module_tp_dim(mt_gpt_root(gpt)), tp_dim) == 0 &&
                  strcmp(mt_module_tp_dim(block0), tp_dim) == 0,
              "the model's tp dimension is '%s', the mesh's '%s'",
              mt_module_tp_dim(mt_gpt_root(gpt)), tp_dim);
    for (size_t i = 0; i < mt_module_param_count(block0); i++) {
        mt_param *p = mt_module_param(block0, i);
        mt_tp_placement pl = mt_param_tp(p);
        if (pl.kind != MT_TP_SHARD) continue;
        CHECK_MSG(mt_param_local_dim(p, pl.dim) * c->tp_size == mt_param_global_dim(p, pl.dim),
                  "'%s' holds %lld of %lld rows on tp %d", mt_param_name(p),
                  (long long)mt_param_local_dim(p, pl.dim),
                  (long long)mt_param_global_dim(p, pl.dim), c->tp_size);
    }
    CHECK_MSG(mt_gpt_param_count(gpt) == expected_params(&cfg), "param count %zu, expected %zu",
              mt_gpt_param_count(gpt), expected_params(&cfg));
    for (int l = 0; l < LAYERS; l++)
        if (perturb_module(c, mt_gpt_block(gpt, l), vocab)) return 1;
    if (perturb_module(c, mt_gpt_root(gpt), vocab)) return 1;
    mt_fsdp_options o = mt_fsdp_defaults(c->mesh, "dp");
    if (use_bf16) o.param_dtype = MT_BF16;
    for (int l = 0; l < LAYERS; l++) TRYC(mt_fsdp_shard(mt_gpt_block(gpt, l), &o));
    TRYC(mt_fsdp_shard(mt_gpt_root(gpt), &o));

    /* The global batch, the same on every rank; this dp rank takes its consecutive share. */
    int tokens[GLOBAL_BATCH * (SEQ + 1)];
    for (int i = 0; i < GLOBAL_BATCH * (SEQ + 1); i++)
        tokens[i] = (int)((i * 2654435761u + 12345u) % (unsigned)vocab);
    int per = GLOBAL_BATCH / c->dp_size;
    const int *mine = tokens + (size_t)c->dp_rank * per * (SEQ + 1);

    float eval_loss = 0.0f, loss = 0.0f;
    TRYC(mt_gpt_forward(gpt, mine, per, &eval_loss));
    TRYC(mt_gpt_forward_backward(gpt, mine, per, 1.0f, &loss));
    CHECK_MSG(eval_loss == loss, "forward-only loss %.9g differs from the training loss %.9g",
              eval_loss, loss);
    mt_mem_stats ms;
    mt_device_mem_stats(mt_runtime_device(c->rt), &ms);
    /* All that stays is sequence parallelism's scratch, kept by the model's tp context at the
     * largest call's size: the column backward's part (its rows of the sum go straight into the
     * input gradient, which the model overwrites), behind the re-gathered input unless it was
     * kept gathered (tp/tp_sequence.c). */
    size_t n = (size_t)per * SEQ, kept = 0;
    if (sequence_parallel && c->tp_size > 1)
        kept = ((sequence_parallel == MT_GPT_SP_REGATHER ? n : 0) + n) * D_MODEL * sizeof(float);
    CHECK_MSG(ms.current[MT_MEM_ACTIVATIONS] == kept, "%zu activation bytes still allocated "
              "after the step (%zu kept sequence-parallel scratch expected)",
              ms.current[MT_MEM_ACTIVATIONS], kept);
    CHECK_MSG(ms.peak[MT_MEM_ACTIVATIONS] > 0, "no activation memory was charged");

    float global_loss = 0.0f;
    TRYC(mt_all_reduce(c->dp, &loss, &global_loss, 1, MT_F32, MT_REDUCE_AVG, NULL));
    for (int l = 0; l < LAYERS; l++)
        if (gather_unit(c, mt_gpt_block(gpt, l))) return 1;
    if (gather_unit(c, mt_gpt_root(gpt))) return 1;
    if (c->tp_size > 1)
        CHECK_MSG(c->replicated_ln_checked == (size_t)(4 * LAYERS + 2) * (c->tp_size - 1),
                  "compared %zu LayerNorm gradients across tp ranks, expected %d",
                  c->replicated_ln_checked, (4 * LAYERS + 2) * (c->tp_size - 1));
    int rc = 0;
    if (c->rank == 0) {
        printf("dp %d x tp %d, vocab %d: loss %.9g\n", c->dp_size, c->tp_size, vocab,
               global_loss);
        if (out) rc = write_ref(c, out, global_loss);
        if (ref) rc = compare_ref(c, ref, global_loss);
    }
    mt_gpt_destroy(gpt);
    return rc;
}

int main(int argc, char **argv) {
    int tp = 1, vocab = 256;
    const char *out = NULL, *ref = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--tp") == 0 && v) tp = atoi(v), i++;
        else if (strcmp(argv[i], "--vocab") == 0 && v) vocab = atoi(v), i++;
        else if (strcmp(argv[i], "--out") == 0 && v) out = v, i++;
        else if (strcmp(argv[i], "--ref") == 0 && v) ref = v, i++;
        else if (strcmp(argv[i], "--tp-dim") == 0 && v) tp_dim = v, i++;
        else if (strcmp(argv[i], "--sequence-parallel") == 0)
            sequence_parallel = MT_GPT_SP_REGATHER;
        else if (strcmp(argv[i], "--sequence-parallel=keep-gathered") == 0)
            sequence_parallel = MT_GPT_SP_KEEP_GATHERED;
        else if (strcmp(argv[i], "--bf16") == 0)
            use_bf16 = true, loss_tol = 1e-3, grad_tol = 2e-2;
        else {
            fprintf(stderr,
                    "usage: test_tp [--tp T] [--vocab V] [--bf16] [--tp-dim NAME] "
                    "[--sequence-parallel[=keep-gathered]] (--out FILE | --ref FILE)\n");
            return 2;
        }
    }
    ctx cc = {0}, *c = &cc;
    c->rank = -1;
    TRYC(mt_init(&c->rt, &argc, &argv));
    c->rank = mt_runtime_rank(c->rt);
    int world = mt_runtime_world_size(c->rt);
    if (tp < 1 || world % tp != 0) {
        fprintf(stderr, "tp %d does not divide the world size %d\n", tp, world);
        mt_finalize(c->rt);
        return 2;
    }
    const char *names[2] = {"dp", tp_dim};
    TRYC(mt_mesh_create(c->rt, 2, (int[]){world / tp, tp}, names, &c->mesh));
    TRYC(mt_mesh_group(c->mesh, "dp", &c->dp));
    TRYC(mt_mesh_group(c->mesh, tp_dim, &c->tp));
    c->dp_size = world / tp;
    c->tp_size = tp;
    c->dp_rank = mt_mesh_coord(c->mesh, 0);
    c->tp_rank = mt_mesh_coord(c->mesh, 1);
    int rc = run(c, vocab, out, ref);
    for (size_t i = 0; i < c->nt; i++) {
        free(c->t[i].val);
        free(c->t[i].grad);
    }
    free(c->t);
    mt_mesh_destroy(c->mesh);
    mt_finalize(c->rt);
    if (rc) return rc;
    if (c->rank != 0) return check_failed_ ? 1 : 0;
    return check_report("test_tp");
}
