/* GPT-2 (include/meshtrain/gpt.h), tensor-parallel over the mesh's "tp" dimension.
 *
 * The root module owns the token embedding (vocab-parallel, tied to the LM head), the position
 * embedding and the final LayerNorm; its forward runs the embedding, the blocks in order, ln_f,
 * the head and the loss; its backward runs them in reverse. Each block is a child module:
 *   x -> ln1 -> qkv (column) -> attention (this rank's heads) -> proj (row) -> + x = r
 *   r -> ln2 -> fc (column) -> gelu -> proj (row) -> + r = block output
 * so a block communicates twice in forward (the row linears' all-reduces) and twice in backward
 * (the column linears' input gradients). Activations are allocated on the device per pass
 * (activations category) and freed as backward consumes them. The loss gradient (softmax minus
 * one-hot) is produced by the forward's cross-entropy, since that step has all it needs.
 * With sequence parallelism (config.sequence_parallel, tp > 1) the residual stream and the
 * LayerNorms hold only this rank's n / tp rows (tp.h): the _sp linears gather and
 * reduce-scatter at the borders of the tensor-parallel regions, and the LayerNorm parameters'
 * gradients, computed from those rows only, are summed over tp before FSDP reduces them. A
 * column-parallel linear's gathered input is gathered again in backward (MT_GPT_SP_REGATHER) or
 * kept with the activations from the forward instead of its rows (MT_GPT_SP_KEEP_GATHERED:
 * ln1_full, ln2_full, lnf_full). */
#include "core/error.h"
#include "models/gpt_config.h"
#include "models/model_common.h"

#include <meshtrain/gpt.h>
#include <meshtrain/init.h>
#include <meshtrain/ops.h>
#include <meshtrain/tp.h>

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    P_LN1_W, P_LN1_B, P_QKV_W, P_QKV_B, P_ATTN_W, P_ATTN_B,
    P_LN2_W, P_LN2_B, P_FC_W, P_FC_B, P_PROJ_W, P_PROJ_B, BLOCK_PARAMS
};
enum { R_WTE, R_WPE, R_LNF_W, R_LNF_B, ROOT_PARAMS };

/* The block parameters that only enter matrix products: with a bf16 param_dtype they go to the
 * linears as bf16 (bf16 x bf16 products accumulated in f32, as autocast runs them); the others
 * (LayerNorm, biases) are converted to f32 copies. */
static const bool block_matmul[BLOCK_PARAMS] = {
    [P_QKV_W] = true, [P_ATTN_W] = true, [P_FC_W] = true, [P_PROJ_W] = true};

typedef struct gpt_block {
    mt_gpt *gpt;
    int index;
    mt_param *p[BLOCK_PARAMS];
} gpt_block;

struct mt_gpt {
    mt_gpt_config cfg;
    mt_device *dev;
    mt_tp_ctx tp;
    int C;       /* d_model */
    int c_local; /* C / tp: this rank's attention width (heads_local * head_dim) */
    int heads_local, head_dim;
    int f_local;     /* 4C / tp: this rank's MLP width */
    int vocab_pad;   /* vocab rounded up to a multiple of tp */
    int vocab_local; /* vocab_pad / tp: rows of this rank's wte slice */
    int vocab_real;  /* of those, the rows below vocab (the LM head's columns on this rank) */
    bool sp;         /* sequence parallelism on (asked for, and tp > 1) */
    bool sp_keep;    /* and the column-parallel inputs kept gathered (MT_GPT_SP_KEEP_GATHERED) */
    mt_module *root;
    mt_module **block_modules;
    gpt_block *blocks;
    mt_param *rp[ROOT_PARAMS];
    size_t n_params;
};

/* A block's saved activations (N = batch * seq rows; R = pass->rows: N, or N / tp when
 * sequence-parallel). */
typedef struct block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* R x C (NULL after the forward with sp_keep), R, R */
    float *qkv;                       /* N x 3 c_local */
    float *att;                       /* batch x heads_local x seq x seq */
    float *atty;                      /* N x c_local */
    float *res_mid;                   /* R x C: x + attention branch */
    float *ln2, *ln2_mean, *ln2_rstd; /* as ln1 */
    float *fc, *fc_gelu; /* N x f_local */
    float *ln1_full, *ln2_full; /* N x C: ln1, ln2 gathered (sp_keep only; made by the linears) */
    float *res_out;      /* R x C: the block's output */
} block_acts;

#define BLOCK_ACT_COUNT (sizeof(block_acts) / sizeof(float *))
/* block_discard keeps the last one, res_out. */
_Static_assert(offsetof(block_acts, res_out) == (BLOCK_ACT_COUNT - 1) * sizeof(float *),
               "res_out must stay the last member of block_acts");

/* One forward (and backward) pass: the ctx every module function receives. */
typedef struct gpt_pass {
    mt_gpt *gpt;
    int batch;
    size_t n; /* rows: batch * seq */
    size_t rows; /* rows of the residual stream held here: n, or n / tp when sequence-parallel */
    bool backward;
    float grad_scale;
    int *ids, *targets; /* device, n each */
    float *x0;          /* rows x C: embeddings, the first block's input */
    block_acts *acts;   /* one per layer */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *lnf_full; /* N x C: lnf gathered for the head's backward (sp_keep only) */
    float *d_logits; /* N x vocab_real, filled by the forward's loss when backward follows */
    float *d_res;    /* during backward: the gradient of the residual stream (rows x C) */
    double loss_sum;
} gpt_pass;

/* ---- deterministic initialisation ------------------------------------------------------------ */

typedef enum init_kind { INIT_ZERO, INIT_ONE, INIT_NORMAL } init_kind;

typedef struct param_spec {
    const char *name;
    int ndim;
    int64_t shape[3];
    mt_tp_placement tp;
    init_kind init;
    double std;
} param_spec;

/* The parameters are created without storage, each with its initialiser recorded: the values are
 * defined on the global tensor by (seed, the parameter's id, the global element index), so they
 * are the same whatever the dp x tp and whenever they are computed (mt_gpt_create when not
 * deferred; else after sharding, shard by shard, unless a checkpoint is loaded instead). */
static mt_status add_params(mt_gpt *g, mt_module *m, const param_spec *specs, int count,
                            uint64_t id_base, mt_param **out) {
    for (int i = 0; i < count; i++) {
        const param_spec *s = &specs[i];
        MT_TRY(mt_module_add_param_deferred(m, s->name, s->ndim, s->shape, s->tp, &out[i]));
        int64_t numel = 1;
        for (int d = 0; d < s->ndim; d++) numel *= s->shape[d];
        if (id_base == 0 && i == R_WTE) /* the padding rows are no parameters of the model */
            numel = (int64_t)g->cfg.vocab * g->C;
        g->n_params += (size_t)numel;
        mt_initialiser init = s->init == INIT_ONE    ? mt_init_ones()
                              : s->init == INIT_ZERO ? mt_init_zeros()
                                                     : mt_init_normal(0.0, s->std, g->cfg.seed,
                                                                      id_base + (uint64_t)i);
        MT_TRY(mt_param_set_init(out[i], &init));
    }
    return MT_OK;
}

/* ---- parameters and activations -------------------------------------------------------------- */

/* The values of params[0..n) (mt_model_param_values); scratch[0..n) to free with
 * mt_model_free_all. */
static mt_status read_params(mt_device *dev, mt_param **params, int n, const bool *matmul,
                             const void **vals, mt_dtype *dtypes, float **scratch) {
    return mt_model_param_values(dev, "gpt", params, n, matmul, vals, dtypes, scratch);
}

static const float *block_input(const gpt_pass *pass, int l) {
    return l == 0 ? pass->x0 : pass->acts[l - 1].res_out;
}

/* The tp linears, in their sequence-parallel form when it is on: then the column-parallel input
 * and input gradient and the row-parallel output and output gradient are this rank's rows. With
 * sp_keep the column-parallel forward gathers its input *in into *kept (n x in_f activations,
 * made here, freed with the pass's activations) and frees *in, a LayerNorm's output, which
 * nothing reads after (the LayerNorm's backward takes its input); the backward takes kept. */
static mt_status column_forward(const mt_gpt *g, float **in, float **kept, const void *w,
                                mt_dtype wt, const float *b, float *out, int n, int in_f,
                                int out_f) {
    if (g->sp_keep) {
        MT_TRY(mt_model_act_alloc(g->dev, (size_t)n * (size_t)in_f, false, kept));
        MT_TRY(mt_tp_column_linear_forward_sp_gathered(&g->tp, *in, *kept, w, wt, b, out, n, in_f,
                                                       out_f));
        mt_device_free(g->dev, *in);
        *in = NULL;
        return MT_OK;
    }
    if (g->sp) return mt_tp_column_linear_forward_sp(&g->tp, *in, w, wt, b, out, n, in_f, out_f);
    return mt_tp_column_linear_forward(&g->tp, *in, w, wt, b, out, n, in_f, out_f);
}

/* ow: the tp backwards' overwrite flags for d_w and d_b (grad_ow). */
static mt_status column_backward(const mt_gpt *g, const float *d_out, const float *in,
                                 const float *kept, const void *w, mt_dtype wt, float *d_in,
                                 float *d_w, float *d_b, int n, int in_f, int out_f, unsigned ow) {
    if (g->sp_keep)
        return mt_tp_column_linear_backward_sp_gathered(&g->tp, d_out, kept, w, wt, d_in, d_w,
                                                        d_b, n, in_f, out_f, ow);
    if (g->sp)
        return mt_tp_column_linear_backward_sp(&g->tp, d_out, in, w, wt, d_in, d_w, d_b, n, in_f,
                                               out_f, ow);
    return mt_tp_column_linear_backward(&g->tp, d_out, in, w, wt, d_in, d_w, d_b, n, in_f, out_f,
                                        ow);
}

static mt_status row_forward(const mt_gpt *g, const float *in, const void *w, mt_dtype wt,
                             const float *b, float *out, int n, int in_f, int out_f) {
    if (g->sp) return mt_tp_row_linear_forward_sp(&g->tp, in, w, wt, b, out, n, in_f, out_f);
    return mt_tp_row_linear_forward(&g->tp, in, w, wt, b, out, n, in_f, out_f);
}

static mt_status row_backward(const mt_gpt *g, const float *d_out, const float *in,
                              const void *w, mt_dtype wt, float *d_in, float *d_w, float *d_b,
                              int n, int in_f, int out_f, unsigned ow) {
    if (g->sp)
        return mt_tp_row_linear_backward_sp(&g->tp, d_out, in, w, wt, d_in, d_w, d_b, n, in_f,
                                            out_f, ow);
    return mt_tp_row_linear_backward(&g->tp, d_out, in, w, wt, d_in, d_w, d_b, n, in_f, out_f,
                                     ow);
}

/* The overwrite flags (ops.h) for a weight's and a bias's gradients from fresh[] (which of a
 * module's gradients hold nothing yet: mt_model_param_grads_write). The first op to write each
 * gradient overwrites it, so FSDP's full gradient buffers need no zeroing; every other write,
 * and every write when the buffers hold a gradient already (micro-batches accumulating, an
 * unsharded model), adds. */
static unsigned grad_ow(const bool *fresh, int w, int b) {
    return (w >= 0 && fresh[w] ? MT_OVERWRITE_D_W : 0u) |
           (b >= 0 && fresh[b] ? MT_OVERWRITE_D_BIAS : 0u);
}

/* Where a pass's LayerNorm gradients go: into[i] receives gr[which[i]] (C values each) itself,
 * or, when sequence-parallel, its slice of *part, a zeroed k x C scratch that ln_grads_end sums
 * over tp and adds to the gradients (copies, into a gradient that holds nothing yet). */
static mt_status ln_grads_begin(const mt_gpt *g, float **gr, const int *which, int k,
                                float **part, float **into) {
    for (int i = 0; i < k; i++) into[i] = gr[which[i]];
    if (!g->sp) return MT_OK;
    MT_TRY(mt_model_act_alloc(g->dev, (size_t)k * (size_t)g->C, true, part));
    for (int i = 0; i < k; i++) into[i] = *part + (size_t)i * (size_t)g->C;
    return MT_OK;
}

/* Sequence-parallel: this rank's rows' LayerNorm gradients (part) summed over tp, then added to
 * the gradients, so that every tp rank holds the same full gradient of the replicated
 * parameters. */
static mt_status ln_grads_end(const mt_gpt *g, float **gr, const bool *fresh, const int *which,
                              int k, float *part) {
    if (!g->sp) return MT_OK;
    size_t C = (size_t)g->C;
    MT_TRY(mt_tp_sequence_grad_sum(&g->tp, part, (size_t)k * C));
    for (int i = 0; i < k; i++) {
        float *grad = gr[which[i]], *src = part + (size_t)i * C;
        if (fresh[which[i]])
            MT_TRY(mt_device_copy(g->dev, grad, src, C * sizeof(float), MT_COPY_DEVICE_TO_DEVICE,
                                  NULL));
        else
            MT_TRY(mt_op_add(g->dev, grad, src, grad, C));
    }
    return MT_OK;
}

/* A LayerNorm's backward: d_in accumulates (the residual stream's gradient), or is overwritten
 * where this is its first writer (MT_OVERWRITE_D_IN in ow); its gamma and beta gradients go to
 * into[0], into[1] (ln_grads_begin), overwritten when they are the parameters' own gradients and
 * hold nothing yet (ow), else added. */
static mt_status ln_backward(const mt_gpt *g, const float *d_out, const float *in,
                             const float *gamma, const float *mean, const float *rstd, size_t rows,
                             float *d_in, float *const *into, unsigned ow) {
    return mt_op_layernorm_backward_into(g->dev, d_out, in, gamma, mean, rstd, rows, g->C, d_in,
                                         into[0], into[1],
                                         g->sp ? ow & MT_OVERWRITE_D_IN : ow);
}

/* ---- a block --------------------------------------------------------------------------------- */

static mt_status block_alloc(mt_gpt *g, gpt_pass *pass, block_acts *a) {
    mt_device *dev = g->dev;
    size_t n = pass->n, C = (size_t)g->C, cl = (size_t)g->c_local, fl = (size_t)g->f_local;
    size_t T = (size_t)g->cfg.seq, r = pass->rows;
    size_t att = (size_t)pass->batch * (size_t)g->heads_local * T * T;
    MT_TRY(mt_model_act_alloc(dev, r * C, false, &a->ln1));
    MT_TRY(mt_model_act_alloc(dev, r, false, &a->ln1_mean));
    MT_TRY(mt_model_act_alloc(dev, r, false, &a->ln1_rstd));
    MT_TRY(mt_model_act_alloc(dev, n * 3 * cl, false, &a->qkv));
    MT_TRY(mt_model_act_alloc(dev, att, false, &a->att));
    MT_TRY(mt_model_act_alloc(dev, n * cl, false, &a->atty));
    MT_TRY(mt_model_act_alloc(dev, r * C, false, &a->res_mid));
    MT_TRY(mt_model_act_alloc(dev, r * C, false, &a->ln2));
    MT_TRY(mt_model_act_alloc(dev, r, false, &a->ln2_mean));
    MT_TRY(mt_model_act_alloc(dev, r, false, &a->ln2_rstd));
    MT_TRY(mt_model_act_alloc(dev, n * fl, false, &a->fc));
    MT_TRY(mt_model_act_alloc(dev, n * fl, false, &a->fc_gelu));
    return mt_model_act_alloc(dev, r * C, false, &a->res_out);
}

/* w: the block's parameters (f32 except the four linear weights, which are in wt's dtypes). */
static mt_status block_forward_run(mt_gpt *g, gpt_pass *pass, int l, const void *const *w,
                                   const mt_dtype *wt) {
    block_acts *a = &pass->acts[l];
    mt_device *dev = g->dev;
    const float *x = block_input(pass, l);
    int n = (int)pass->n, C = g->C, cl = g->c_local, fl = g->f_local;
    size_t nc = pass->rows * (size_t)C;
    /* A re-run (activation recompute) finds the output it kept: computed again, like the rest. */
    mt_model_free_all(dev, (float **)a, BLOCK_ACT_COUNT);
    MT_TRY(block_alloc(g, pass, a));
    MT_TRY(mt_op_layernorm_forward(dev, x, w[P_LN1_W], w[P_LN1_B], pass->rows, C, a->ln1,
                                   a->ln1_mean, a->ln1_rstd));
    MT_TRY(column_forward(g, &a->ln1, &a->ln1_full, w[P_QKV_W], wt[P_QKV_W], w[P_QKV_B], a->qkv,
                          n, C, 3 * cl));
    MT_TRY(mt_op_attention_forward(dev, a->qkv, pass->batch, g->cfg.seq, g->heads_local,
                                   g->head_dim, a->atty, a->att));
    MT_TRY(row_forward(g, a->atty, w[P_ATTN_W], wt[P_ATTN_W], w[P_ATTN_B], a->res_mid, n, cl,
                       C));
    MT_TRY(mt_op_add(dev, x, a->res_mid, a->res_mid, nc));
    MT_TRY(mt_op_layernorm_forward(dev, a->res_mid, w[P_LN2_W], w[P_LN2_B], pass->rows, C,
                                   a->ln2, a->ln2_mean, a->ln2_rstd));
    MT_TRY(column_forward(g, &a->ln2, &a->ln2_full, w[P_FC_W], wt[P_FC_W], w[P_FC_B], a->fc, n, C,
                          fl));
    MT_TRY(mt_op_gelu_forward(dev, a->fc, a->fc_gelu, pass->n * (size_t)fl));
    MT_TRY(row_forward(g, a->fc_gelu, w[P_PROJ_W], wt[P_PROJ_W], w[P_PROJ_B], a->res_out, n, fl,
                       C));
    return mt_op_add(dev, a->res_mid, a->res_out, a->res_out, nc);
}

static mt_status block_forward(mt_module *module, void *ctx) {
    gpt_block *blk = mt_module_user(module);
    gpt_pass *pass = ctx;
    mt_gpt *g = blk->gpt;
    const void *w[BLOCK_PARAMS];
    mt_dtype wt[BLOCK_PARAMS];
    float *scratch[BLOCK_PARAMS] = {0};
    mt_status st = read_params(g->dev, blk->p, BLOCK_PARAMS, block_matmul, w, wt, scratch);
    if (st == MT_OK) st = block_forward_run(g, pass, blk->index, w, wt);
    mt_model_free_all(g->dev, scratch, BLOCK_PARAMS);
    if (st != MT_OK) return mt_error_wrap(st, "gpt: forward of block %d", blk->index);
    return MT_OK;
}

/* Activation recompute (recompute.h): after the forward only the output stays, the next
 * block's input and the head's; the backward's re-run forward computes the rest again. */
static mt_status block_discard(mt_module *module, void *ctx) {
    gpt_block *blk = mt_module_user(module);
    gpt_pass *pass = ctx;
    mt_model_free_all(blk->gpt->dev, (float **)&pass->acts[blk->index], BLOCK_ACT_COUNT - 1);
    return MT_OK;
}

/* Gradient scratch of one block's backward. */
typedef struct block_grads {
    float *d_fc_gelu, *d_fc, *d_ln2, *d_atty, *d_qkv, *d_ln1;
    float *d_ln_params; /* sequence-parallel: this pass's LayerNorm gradients, 4 x C */
} block_grads;

static const int block_ln_params[4] = {P_LN2_W, P_LN2_B, P_LN1_W, P_LN1_B};

/* gr: the block's gradients; fresh: which hold nothing yet (each is overwritten by its first op,
 * grad_ow). The activation gradients in d are not zeroed: the op that writes each first
 * overwrites it (MT_OVERWRITE_D_IN), the ones after add. */
static mt_status block_backward_run(mt_gpt *g, gpt_pass *pass, int l, const void *const *w,
                                    const mt_dtype *wt, float **gr, const bool *fresh,
                                    block_grads *d) {
    block_acts *a = &pass->acts[l];
    mt_device *dev = g->dev;
    const float *x = block_input(pass, l);
    float *d_res = pass->d_res; /* the gradient of the block's output, then of its input */
    int n = (int)pass->n, C = g->C, cl = g->c_local, fl = g->f_local;
    size_t N = pass->n, R = pass->rows;
    float *lg[4]; /* where the LayerNorm gradients go: block_ln_params' order */
    const unsigned first = MT_OVERWRITE_D_IN; /* each op below is its d_in's first writer */
    MT_TRY(mt_model_act_alloc(dev, N * (size_t)fl, false, &d->d_fc_gelu));
    MT_TRY(mt_model_act_alloc(dev, N * (size_t)fl, false, &d->d_fc));
    MT_TRY(mt_model_act_alloc(dev, R * (size_t)C, false, &d->d_ln2));
    MT_TRY(mt_model_act_alloc(dev, N * (size_t)cl, false, &d->d_atty));
    MT_TRY(mt_model_act_alloc(dev, N * 3 * (size_t)cl, false, &d->d_qkv));
    MT_TRY(mt_model_act_alloc(dev, R * (size_t)C, false, &d->d_ln1));
    MT_TRY(ln_grads_begin(g, gr, block_ln_params, 4, &d->d_ln_params, lg));
    /* MLP branch; the residual passes d_res through unchanged, the LayerNorm adds to it. */
    MT_TRY(row_backward(g, d_res, a->fc_gelu, w[P_PROJ_W], wt[P_PROJ_W], d->d_fc_gelu,
                        gr[P_PROJ_W], gr[P_PROJ_B], n, fl, C,
                        first | grad_ow(fresh, P_PROJ_W, P_PROJ_B)));
    MT_TRY(mt_op_gelu_backward_into(dev, a->fc, d->d_fc_gelu, d->d_fc, N * (size_t)fl, first));
    MT_TRY(column_backward(g, d->d_fc, a->ln2, a->ln2_full, w[P_FC_W], wt[P_FC_W], d->d_ln2,
                           gr[P_FC_W], gr[P_FC_B], n, C, fl,
                           first | grad_ow(fresh, P_FC_W, P_FC_B)));
    MT_TRY(ln_backward(g, d->d_ln2, a->res_mid, w[P_LN2_W], a->ln2_mean, a->ln2_rstd, R, d_res,
                       lg, grad_ow(fresh, P_LN2_W, P_LN2_B)));
    /* Attention branch. */
    MT_TRY(row_backward(g, d_res, a->atty, w[P_ATTN_W], wt[P_ATTN_W], d->d_atty, gr[P_ATTN_W],
                        gr[P_ATTN_B], n, cl, C, first | grad_ow(fresh, P_ATTN_W, P_ATTN_B)));
    MT_TRY(mt_op_attention_backward_into(dev, d->d_atty, a->qkv, a->att, pass->batch,
                                         g->cfg.seq, g->heads_local, g->head_dim, d->d_qkv, first));
    MT_TRY(column_backward(g, d->d_qkv, a->ln1, a->ln1_full, w[P_QKV_W], wt[P_QKV_W], d->d_ln1,
                           gr[P_QKV_W], gr[P_QKV_B], n, C, 3 * cl,
                           first | grad_ow(fresh, P_QKV_W, P_QKV_B)));
    MT_TRY(ln_backward(g, d->d_ln1, x, w[P_LN1_W], a->ln1_mean, a->ln1_rstd, R, d_res, lg + 2,
                       grad_ow(fresh, P_LN1_W, P_LN1_B)));
    return ln_grads_end(g, gr, fresh, block_ln_params, 4, d->d_ln_params);
}

static mt_status block_backward(mt_module *module, void *ctx) {
    gpt_block *blk = mt_module_user(module);
    gpt_pass *pass = ctx;
    mt_gpt *g = blk->gpt;
    const void *w[BLOCK_PARAMS];
    mt_dtype wt[BLOCK_PARAMS];
    float *gr[BLOCK_PARAMS];
    bool fresh[BLOCK_PARAMS];
    float *scratch[BLOCK_PARAMS] = {0};
    block_grads d = {0};
    mt_status st = mt_model_param_grads_write("gpt", module, blk->p, BLOCK_PARAMS, gr, fresh);
    if (st == MT_OK) st = read_params(g->dev, blk->p, BLOCK_PARAMS, block_matmul, w, wt, scratch);
    if (st == MT_OK) st = block_backward_run(g, pass, blk->index, w, wt, gr, fresh, &d);
    mt_model_free_all(g->dev, scratch, BLOCK_PARAMS);
    mt_model_free_all(g->dev, (float **)&d, sizeof d / sizeof(float *));
    if (st != MT_OK) return mt_error_wrap(st, "gpt: backward of block %d", blk->index);
    /* The block's activations are used up (the next block's backward already read its output). */
    mt_model_free_all(g->dev, (float **)&pass->acts[blk->index], BLOCK_ACT_COUNT);
    return MT_OK;
}

/* ---- the root -------------------------------------------------------------------------------- */

static mt_status embed(mt_gpt *g, gpt_pass *pass) {
    mt_param *ps[2] = {g->rp[R_WTE], g->rp[R_WPE]};
    const void *w[2];
    mt_dtype wt[2];
    float *scratch[2] = {0};
    /* The lookup reads f32 rows: wte is converted here, although the head takes it as bf16. */
    mt_status st = read_params(g->dev, ps, 2, NULL, w, wt, scratch);
    if (st == MT_OK) st = mt_model_act_alloc(g->dev, pass->rows * (size_t)g->C, false, &pass->x0);
    if (st == MT_OK && g->sp)
        st = mt_tp_vocab_embedding_forward_sp(&g->tp, pass->ids, (int)pass->n, w[0],
                                              g->vocab_local, g->C, pass->x0);
    else if (st == MT_OK)
        st = mt_tp_vocab_embedding_forward(&g->tp, pass->ids, (int)pass->n, w[0], g->vocab_local,
                                           g->C, pass->x0);
    if (st == MT_OK && g->sp)
        st = mt_tp_sequence_position_forward(&g->tp, w[1], (int)pass->n, g->cfg.seq, g->C,
                                             pass->x0);
    else if (st == MT_OK)
        st = mt_op_position_forward(g->dev, w[1], pass->batch, g->cfg.seq, g->C, pass->x0);
    mt_model_free_all(g->dev, scratch, 2);
    return st;
}

/* ln_f, the tied head on this rank's vocabulary columns, the loss (and its gradient). */
static mt_status head_forward(mt_gpt *g, gpt_pass *pass) {
    mt_param *ps[3] = {g->rp[R_LNF_W], g->rp[R_LNF_B], g->rp[R_WTE]};
    static const bool matmul[3] = {false, false, true};
    const void *w[3];
    mt_dtype wt[3];
    float *scratch[3] = {0}, *logits = NULL;
    size_t n = pass->n, C = (size_t)g->C, v = (size_t)g->vocab_real;
    const float *x = pass->acts[g->cfg.layers - 1].res_out;
    size_t r = pass->rows; /* ln_f runs on this rank's rows when sequence-parallel */
    mt_status st = read_params(g->dev, ps, 3, matmul, w, wt, scratch);
    if (st == MT_OK) st = mt_model_act_alloc(g->dev, r * C, false, &pass->lnf);
    if (st == MT_OK) st = mt_model_act_alloc(g->dev, r, false, &pass->lnf_mean);
    if (st == MT_OK) st = mt_model_act_alloc(g->dev, r, false, &pass->lnf_rstd);
    if (st == MT_OK)
        st = mt_op_layernorm_forward(g->dev, x, w[0], w[1], r, g->C, pass->lnf, pass->lnf_mean,
                                     pass->lnf_rstd);
    if (st == MT_OK) st = mt_model_act_alloc(g->dev, n * v, false, &logits);
    /* The head is a column-parallel linear without bias: wte's first vocab_real local rows. */
    if (st == MT_OK)
        st = column_forward(g, &pass->lnf, &pass->lnf_full, w[2], wt[2], NULL, logits, (int)n,
                            g->C, g->vocab_real);
    if (st == MT_OK && pass->backward)
        st = mt_model_act_alloc(g->dev, n * v, true, &pass->d_logits);
    if (st == MT_OK)
        st = mt_tp_vocab_cross_entropy_range(&g->tp, logits, pass->targets, (int)n,
                                             g->tp.rank * g->vocab_local, g->vocab_real,
                                             pass->grad_scale / (float)n, &pass->loss_sum,
                                             pass->d_logits);
    mt_device_free(g->dev, logits);
    mt_model_free_all(g->dev, scratch, 3);
    return st;
}

static mt_status root_forward(mt_module *module, void *ctx) {
    mt_gpt *g = mt_module_user(module);
    gpt_pass *pass = ctx;
    MT_TRY(embed(g, pass));
    for (int l = 0; l < g->cfg.layers; l++) MT_TRY(mt_module_forward(g->block_modules[l], pass));
    return head_forward(g, pass);
}

static const int root_ln_params[2] = {R_LNF_W, R_LNF_B};

/* The head writes wte's gradient first (the embedding's backward adds to it after the blocks): its
 * product covers the vocab_real rows it reads, the padding rows beyond are zeroed here when the
 * gradient holds nothing yet. */
static mt_status head_backward(mt_gpt *g, gpt_pass *pass, float **gr, const bool *fresh) {
    mt_param *ps[2] = {g->rp[R_LNF_W], g->rp[R_WTE]};
    static const bool matmul[2] = {false, true};
    const void *w[2];
    mt_dtype wt[2];
    float *scratch[2] = {0}, *d_lnf = NULL, *d_ln_params = NULL, *lg[2];
    size_t n = pass->n, r = pass->rows, C = (size_t)g->C;
    const float *x = pass->acts[g->cfg.layers - 1].res_out;
    mt_status st = read_params(g->dev, ps, 2, matmul, w, wt, scratch);
    /* d_lnf and d_res are written first by the head's product and ln_f's backward: not zeroed. */
    if (st == MT_OK) st = mt_model_act_alloc(g->dev, r * C, false, &d_lnf);
    if (st == MT_OK)
        st = column_backward(g, pass->d_logits, pass->lnf, pass->lnf_full, w[1], wt[1], d_lnf,
                             gr[R_WTE], NULL, (int)n, g->C, g->vocab_real,
                             MT_OVERWRITE_D_IN | grad_ow(fresh, R_WTE, -1));
    size_t pad_rows = (size_t)(g->vocab_local - g->vocab_real);
    if (st == MT_OK && fresh[R_WTE] && pad_rows > 0)
        st = mt_device_memset(g->dev, gr[R_WTE] + (size_t)g->vocab_real * C, 0,
                              pad_rows * C * sizeof(float), NULL);
    if (st == MT_OK) st = mt_model_act_alloc(g->dev, r * C, false, &pass->d_res);
    if (st == MT_OK) st = ln_grads_begin(g, gr, root_ln_params, 2, &d_ln_params, lg);
    if (st == MT_OK)
        st = ln_backward(g, d_lnf, x, w[0], pass->lnf_mean, pass->lnf_rstd, r, pass->d_res, lg,
                         MT_OVERWRITE_D_IN | grad_ow(fresh, R_LNF_W, R_LNF_B));
    if (st == MT_OK) st = ln_grads_end(g, gr, fresh, root_ln_params, 2, d_ln_params);
    mt_device_free(g->dev, d_ln_params);
    mt_device_free(g->dev, d_lnf);
    mt_model_free_all(g->dev, scratch, 2);
    if (st == MT_OK) {
        float *used[5] = {pass->d_logits, pass->lnf, pass->lnf_mean, pass->lnf_rstd,
                          pass->lnf_full};
        mt_model_free_all(g->dev, used, 5);
        pass->d_logits = pass->lnf = pass->lnf_mean = pass->lnf_rstd = pass->lnf_full = NULL;
    }
    return st;
}

static mt_status root_backward(mt_module *module, void *ctx) {
    mt_gpt *g = mt_module_user(module);
    gpt_pass *pass = ctx;
    if (!pass->backward || !pass->d_logits)
        return mt_error(MT_ERR_INTERNAL, "gpt: backward without a forward that kept the loss "
                        "gradient");
    float *gr[ROOT_PARAMS];
    bool fresh[ROOT_PARAMS];
    MT_TRY(mt_model_param_grads_write("gpt", module, g->rp, ROOT_PARAMS, gr, fresh));
    MT_TRY(head_backward(g, pass, gr, fresh));
    for (int l = g->cfg.layers - 1; l >= 0; l--)
        MT_TRY(mt_module_backward(g->block_modules[l], pass));
    if (g->sp) {
        /* The embeddings take the gradient of every row (each rank's wte slice looks up all ids;
         * wpe, replicated, gets its full gradient on every rank from the gathered rows). */
        float *full = NULL;
        MT_TRY(mt_model_act_alloc(g->dev, pass->n * (size_t)g->C, false, &full));
        mt_status st = mt_tp_sequence_gather(&g->tp, pass->d_res, full, (int)pass->n, g->C);
        mt_device_free(g->dev, pass->d_res);
        pass->d_res = full;
        MT_TRY(st);
    }
    MT_TRY(mt_op_position_backward_into(g->dev, pass->d_res, pass->batch, g->cfg.seq, g->C,
                                        gr[R_WPE], grad_ow(fresh, R_WPE, -1)));
    return mt_tp_vocab_embedding_backward(&g->tp, pass->ids, (int)pass->n, pass->d_res,
                                          g->vocab_local, g->C, gr[R_WTE]);
}

/* ---- creation -------------------------------------------------------------------------------- */

static mt_status add_block(mt_gpt *g, mt_mesh *mesh, int l) {
    gpt_block *blk = &g->blocks[l];
    blk->gpt = g;
    blk->index = l;
    char name[32];
    snprintf(name, sizeof name, "block%d", l);
    static const mt_module_ops ops = {.forward = block_forward, .backward = block_backward,
                                      .discard = block_discard};
    mt_module *m = NULL;
    MT_TRY(mt_model_add_child(mesh, g->root, name, &ops, blk, &m));
    g->block_modules[l] = m;
    int64_t C = g->C;
    const mt_tp_placement rep = {MT_TP_REPLICATE, 0}, s0 = {MT_TP_SHARD, 0},
                          s1 = {MT_TP_SHARD, 1};
    double std = 0.02, res_std = 0.02 / sqrt(2.0 * g->cfg.layers);
    const param_spec specs[BLOCK_PARAMS] = {
        [P_LN1_W] = {"ln_1.weight", 1, {C}, rep, INIT_ONE, 0},
        [P_LN1_B] = {"ln_1.bias", 1, {C}, rep, INIT_ZERO, 0},
        /* q, k and v stacked: each rank holds its heads' rows of all three. */
        [P_QKV_W] = {"attn.qkv.weight", 3, {3, C, C}, s1, INIT_NORMAL, std},
        [P_QKV_B] = {"attn.qkv.bias", 2, {3, C}, s1, INIT_ZERO, 0},
        [P_ATTN_W] = {"attn.proj.weight", 2, {C, C}, s1, INIT_NORMAL, res_std},
        [P_ATTN_B] = {"attn.proj.bias", 1, {C}, rep, INIT_ZERO, 0},
        [P_LN2_W] = {"ln_2.weight", 1, {C}, rep, INIT_ONE, 0},
        [P_LN2_B] = {"ln_2.bias", 1, {C}, rep, INIT_ZERO, 0},
        [P_FC_W] = {"mlp.fc.weight", 2, {4 * C, C}, s0, INIT_NORMAL, std},
        [P_FC_B] = {"mlp.fc.bias", 1, {4 * C}, s0, INIT_ZERO, 0},
        [P_PROJ_W] = {"mlp.proj.weight", 2, {C, 4 * C}, s1, INIT_NORMAL, res_std},
        [P_PROJ_B] = {"mlp.proj.bias", 1, {C}, rep, INIT_ZERO, 0},
    };
    return add_params(g, m, specs, BLOCK_PARAMS, 64 * ((uint64_t)l + 1), blk->p);
}

static mt_status add_root_params(mt_gpt *g) {
    int64_t C = g->C;
    const mt_tp_placement rep = {MT_TP_REPLICATE, 0}, s0 = {MT_TP_SHARD, 0};
    const param_spec specs[ROOT_PARAMS] = {
        [R_WTE] = {"wte.weight", 2, {g->vocab_pad, C}, s0, INIT_NORMAL, 0.02},
        [R_WPE] = {"wpe.weight", 2, {g->cfg.seq, C}, rep, INIT_NORMAL, 0.02},
        [R_LNF_W] = {"ln_f.weight", 1, {C}, rep, INIT_ONE, 0},
        [R_LNF_B] = {"ln_f.bias", 1, {C}, rep, INIT_ZERO, 0},
    };
    MT_TRY(add_params(g, g->root, specs, ROOT_PARAMS, 0, g->rp));
    /* wte's rows beyond the vocabulary only make it divide over tp: not the model's state. */
    return mt_param_set_padding(g->rp[R_WTE], g->cfg.vocab);
}

mt_status mt_gpt_create(mt_mesh *mesh, const mt_gpt_config *config, mt_gpt **out) {
    if (!mesh || !config || !out)
        return mt_error(MT_ERR_INVALID_ARG, "gpt: mesh, config and out must not be NULL");
    *out = NULL;
    mt_tp_ctx tp;
    const char *tp_dim = config->tp_dim ? config->tp_dim : MT_TP_DIM_DEFAULT;
    MT_TRY(mt_tp_context_dim(mesh, tp_dim, &tp));
    const mt_gpt_config *c = config;
    mt_status chk = mt_gpt_config_check(c, tp.size, c->sequence_parallel);
    mt_gpt *g = chk == MT_OK ? calloc(1, sizeof *g) : NULL;
    if (!g) {
        mt_tp_context_release(&tp);
        return chk != MT_OK ? chk
                            : mt_error(MT_ERR_OUT_OF_MEMORY, "gpt: out of host memory for %d "
                                       "layers", c->layers);
    }
    g->tp = tp; /* owned by g from here: mt_gpt_destroy releases it */
    g->block_modules = calloc((size_t)c->layers, sizeof *g->block_modules);
    g->blocks = calloc((size_t)c->layers, sizeof *g->blocks);
    if (!g->block_modules || !g->blocks) {
        mt_gpt_destroy(g);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "gpt: out of host memory for %d layers", c->layers);
    }
    g->cfg = *c;
    g->dev = tp.dev;
    g->C = c->d_model;
    g->c_local = c->d_model / tp.size;
    g->heads_local = c->heads / tp.size;
    g->head_dim = c->d_model / c->heads;
    g->f_local = 4 * c->d_model / tp.size;
    g->vocab_local = (c->vocab + tp.size - 1) / tp.size;
    g->vocab_pad = g->vocab_local * tp.size;
    int real = c->vocab - tp.rank * g->vocab_local;
    g->vocab_real = real < g->vocab_local ? real : g->vocab_local;
    g->sp = c->sequence_parallel && tp.size > 1;
    g->sp_keep = g->sp && c->sequence_parallel == MT_GPT_SP_KEEP_GATHERED;
    static const mt_module_ops root_ops = {.forward = root_forward, .backward = root_backward};
    mt_status st = mt_module_create(mesh, "gpt", &root_ops, g, &g->root);
    if (st == MT_OK) st = mt_module_set_tp_dim(g->root, tp_dim);
    for (int l = 0; l < c->layers && st == MT_OK; l++) st = add_block(g, mesh, l);
    if (st == MT_OK) st = add_root_params(g);
    if (st == MT_OK && !c->defer_init) st = mt_module_init_params(g->root);
    if (st != MT_OK) {
        mt_gpt_destroy(g);
        return st;
    }
    *out = g;
    return MT_OK;
}

void mt_gpt_destroy(mt_gpt *gpt) {
    if (!gpt) return;
    mt_module_destroy(gpt->root); /* and the blocks, its children */
    mt_tp_context_release(&gpt->tp); /* the sequence-parallel scratch it kept */
    free(gpt->block_modules);
    free(gpt->blocks);
    free(gpt);
}

mt_module *mt_gpt_root(mt_gpt *gpt) { return gpt ? gpt->root : NULL; }

mt_module *mt_gpt_block(mt_gpt *gpt, int layer) {
    if (!gpt || layer < 0 || layer >= gpt->cfg.layers) return NULL;
    return gpt->block_modules[layer];
}

size_t mt_gpt_param_count(const mt_gpt *gpt) { return gpt ? gpt->n_params : 0; }

/* ---- passes ---------------------------------------------------------------------------------- */

static void pass_release(gpt_pass *pass) {
    mt_device *dev = pass->gpt->dev;
    if (pass->acts)
        for (int l = 0; l < pass->gpt->cfg.layers; l++)
            mt_model_free_all(dev, (float **)&pass->acts[l], BLOCK_ACT_COUNT);
    free(pass->acts);
    float *rest[7] = {pass->x0, pass->lnf, pass->lnf_mean, pass->lnf_rstd, pass->lnf_full,
                      pass->d_logits, pass->d_res};
    mt_model_free_all(dev, rest, 7);
    mt_device_free(dev, pass->ids);
    mt_device_free(dev, pass->targets);
    memset(pass, 0, sizeof *pass);
}

/* Checks this rank's tokens and copies inputs and targets to the device. */
static mt_status pass_prepare(mt_gpt *g, const int *tokens, int batch, bool backward,
                              float grad_scale, gpt_pass *pass) {
    memset(pass, 0, sizeof *pass);
    pass->gpt = g;
    if (!tokens || batch < 1)
        return mt_error(MT_ERR_INVALID_ARG, "gpt: a pass needs tokens and batch >= 1 (batch %d)",
                        batch);
    int T = g->cfg.seq;
    if ((int64_t)batch * T > INT32_MAX / 4)
        return mt_error(MT_ERR_INVALID_ARG, "gpt: batch %d x seq %d tokens is too many for one "
                        "pass", batch, T);
    pass->batch = batch;
    pass->n = (size_t)batch * (size_t)T;
    pass->rows = g->sp ? pass->n / (size_t)g->tp.size : pass->n;
    pass->backward = backward;
    pass->grad_scale = grad_scale;
    pass->acts = calloc((size_t)g->cfg.layers, sizeof *pass->acts);
    int *host = malloc(2 * pass->n * sizeof *host);
    if (!pass->acts || !host) {
        free(host);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "gpt: out of host memory for a pass of %zu tokens",
                        pass->n);
    }
    mt_status st = MT_OK;
    for (int b = 0; b < batch && st == MT_OK; b++)
        for (int t = 0; t <= T; t++) {
            int id = tokens[(size_t)b * (size_t)(T + 1) + (size_t)t];
            if (id < 0 || id >= g->cfg.vocab) {
                st = mt_error(MT_ERR_INVALID_ARG, "gpt: token %d at sequence %d, position %d is "
                              "outside the vocabulary [0, %d)", id, b, t, g->cfg.vocab);
                break;
            }
            if (t < T) host[(size_t)b * T + t] = id;
            if (t > 0) host[pass->n + (size_t)b * T + t - 1] = id;
        }
    size_t bytes = pass->n * sizeof(int);
    if (st == MT_OK)
        st = mt_device_alloc(g->dev, bytes, MT_MEM_ACTIVATIONS, (void **)&pass->ids);
    if (st == MT_OK)
        st = mt_device_alloc(g->dev, bytes, MT_MEM_ACTIVATIONS, (void **)&pass->targets);
    if (st == MT_OK)
        st = mt_device_copy(g->dev, pass->ids, host, bytes, MT_COPY_HOST_TO_DEVICE, NULL);
    if (st == MT_OK)
        st = mt_device_copy(g->dev, pass->targets, host + pass->n, bytes, MT_COPY_HOST_TO_DEVICE,
                            NULL);
    free(host);
    return st;
}

static mt_status run_pass(mt_gpt *gpt, const int *tokens, int batch, bool backward,
                          float grad_scale, float *loss) {
    gpt_pass pass;
    mt_status st = pass_prepare(gpt, tokens, batch, backward, grad_scale, &pass);
    if (st == MT_OK) st = mt_module_forward(gpt->root, &pass);
    if (st == MT_OK && backward) st = mt_module_backward(gpt->root, &pass);
    if (st == MT_OK && loss) *loss = (float)(pass.loss_sum / (double)pass.n);
    pass_release(&pass); /* pass_prepare set pass.gpt whatever happened */
    return st;
}

mt_status mt_gpt_forward_backward(mt_gpt *gpt, const int *tokens, int batch, float grad_scale,
                                  float *loss) {
    if (!gpt) return mt_error(MT_ERR_INVALID_ARG, "gpt: forward_backward on a NULL model");
    return run_pass(gpt, tokens, batch, true, grad_scale, loss);
}

mt_status mt_gpt_forward(mt_gpt *gpt, const int *tokens, int batch, float *loss) {
    if (!gpt) return mt_error(MT_ERR_INVALID_ARG, "gpt: forward on a NULL model");
    return run_pass(gpt, tokens, batch, false, 1.0f, loss);
}
