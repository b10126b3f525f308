/* The memory prediction of a GPT training step (mt_gpt_memory_predict, include/meshtrain/gpt.h).
 *
 * Not a formula: one step is replayed on a timeline (models/mem_timeline.h) as the program runs
 * it, allocation by allocation, in program order, with the sizes the code uses:
 *   - between steps: each FSDP unit's master shard, its bf16 copy, its gradient shard, AdamW's m
 *     and v (made with the optimizer), the transport's scratch of every group (kept), and with
 *     sequence parallelism the tp context's kept scratch (tp/tp_sequence.c: as large as its
 *     largest call's; it grows to that in the first step, which the measured peaks, taken over
 *     several steps, do not exceed);
 *   - per micro-batch: the token ids; the root's gather (FSDP hooks, fsdp/fsdp_schedule.c) and the
 *     prefetch of the next unit in the recorded order; embedding; each block's forward (its
 *     saved activations, parameter copies, the linears' scratch); ln_f, the head and the loss;
 *     backward in reverse, each unit's gradient buffer, its reduce-scatter staging (one in
 *     flight: the previous is finished by the next unit's post-backward hook) and its reshard;
 *   - the optimizer step's clip accumulator;
 *   - FSDP CPU offload (fsdp/fsdp_offload.c): offloaded units' shards and AdamW state on a second
 *     timeline, the host tier's; on the device, optimizer's shard copy, full's staged shards
 *     and the reduced shard's buffer until it lands (OFFLOAD below).
 * The replay mirrors models/gpt.c, fsdp/, tp/, core/cpu/ops_bf16.c and comm/coll_build.c line by
 * line (each function here names the one it follows), so a change to those should change this
 * file too: the memory tests compare every category with the device's accounting and fail
 * otherwise; they do for activation checkpointing (AC below) and both sequence-parallel modes
 * (SP below) too. */
#include "core/cpu/bf16_gemm_path.h"
#include "core/error.h"
#include "comm/coll_scratch.h"
#include "fsdp/fsdp_mapped.h"
#include "models/gpt_config.h"
#include "models/mem_timeline.h"

#include <meshtrain/fsdp.h>
#include <meshtrain/gpt.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mt_gpt_memory_plan mt_gpt_memory_plan_defaults(void) {
    return (mt_gpt_memory_plan){.dp = 1, .replicate = 1, .tp = 1, .batch = 8, .grad_accum = 1,
                                .param_dtype = MT_F32, .reduce_dtype = MT_F32,
                                .reshard_after_forward = -1, .prefetch = true,
                                .activation_checkpointing = MT_GPT_AC_NONE, .ac_every = 1,
                                .sequence_parallel = MT_GPT_SP_OFF, .cpu_device = true,
                                .comm_small_bytes = 0, .offload = 0, .offload_ratio = 1.0f,
                                .mapped_gather = true};
}

/* The tp-local sizes of tp rank 0 (the largest vocabulary slice), as mt_gpt_create sets them. */
typedef struct gpt_shape {
    size_t L, C, T, B, N;
    size_t cl, fl, hl; /* this rank's attention width, MLP width, heads */
    size_t vl;         /* rows of the wte slice (vocab padded to tp, / tp) */
    size_t V;          /* of those, real ids: the head's columns on tp rank 0 */
    size_t rows;       /* rows outside attention and MLP: N, or N / tp with SP */
    int tp;
} gpt_shape;

/* An FSDP unit: the flat buffer's sizes and which of its buffers exist now. */
typedef struct sim_unit {
    size_t padded, S;
    bool root;
    bool full, full_grad; /* gathered parameters, gradient buffer */
    bool grad_aliased;    /* the gradient buffer is the shard (grads_alias) */
    int off;              /* its offload policy (fsdp_offload.c, mt_fsdp_offload_setup) */
    bool staged;          /* full offload: its device shard, staged for an all-gather */
    bool mapped;          /* its gather maps the ranks' shards: no full buffer (map_units) */
} sim_unit;

typedef struct sim {
    mt_mem_timeline tl;
    mt_mem_timeline host; /* the host tier (host_memory.h) */
    size_t landing;       /* fsdp_offload.c: the landing block's bytes (host, comm) */
    size_t pending_recv;  /* and the device buffer of the reduced shard landing in it */
    bool pending;
    const mt_gpt_memory_plan *plan;
    gpt_shape s;
    bool bf16_scratch; /* bf16 products widen operands into activations scratch (CPU) */
    bool bf16_narrow;  /* on oneDNN: only the rounded f32 operands, as bf16 copies */
    bool sp;           /* sequence parallelism, which at tp 1 has nothing to shard */
    bool sp_keep;      /* and the column-parallel inputs kept gathered from the forward */
    size_t sp_kept;    /* SP: the tp context's kept scratch (bytes), made in persistent() */
    bool sp_short;     /* a replayed SP call needed more than sp_kept: a bug here */
    bool defer_init;   /* the model is created deferred (config.defer_init) */
    size_t es_param, es_reduce;
    sim_unit *units; /* [0]: the root; [1 + l]: block l */
    sim_unit *rs_pending;
    bool sync; /* this micro-batch reduces its gradients (the last of the step) */
    int mb;    /* the micro-batch replayed */
} sim;

#define NO_INDEX ((size_t)-1)

/* Names the phase (what, then block l unless NO_INDEX); under accumulation with the micro-batch,
 * since the gradient buffers kept without sync make the micro-batches' peaks differ. */
static void phase(sim *m, const char *what, size_t l) {
    char mb[24] = "";
    if (m->plan->grad_accum > 1) snprintf(mb, sizeof mb, "micro-batch %d: ", m->mb + 1);
    if (l == NO_INDEX) mt_mem_timeline_phase(&m->tl, "%s%s", mb, what);
    else mt_mem_timeline_phase(&m->tl, "%s%s %zu", mb, what, l);
}

static void alloc(sim *m, mt_mem_category c, size_t bytes) {
    mt_mem_timeline_alloc(&m->tl, c, bytes);
}
static void release(sim *m, mt_mem_category c, size_t bytes) {
    mt_mem_timeline_free(&m->tl, c, bytes);
}

/* mt_model_act_alloc / mt_tp_scratch: at least one float. */
static size_t act_bytes(size_t elems) { return (elems ? elems : 1) * sizeof(float); }
static void act(sim *m, size_t elems) { alloc(m, MT_MEM_ACTIVATIONS, act_bytes(elems)); }
static void act_free(sim *m, size_t elems) { release(m, MT_MEM_ACTIVATIONS, act_bytes(elems)); }

/* Scratch that exists together for one operation and goes after it: bytes[0..n), zeros
 * skipped. */
static void act_transient_bytes(sim *m, const size_t *bytes, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (bytes[i]) alloc(m, MT_MEM_ACTIVATIONS, bytes[i]);
    for (size_t i = 0; i < n; i++)
        if (bytes[i]) release(m, MT_MEM_ACTIVATIONS, bytes[i]);
}

/* The bytes of a bf16 product's scratch operand of elems values (core/cpu/ops_bf16.c): f32 when
 * widened, a bf16 copy on oneDNN (at least one value); 0 when the path makes none (bf16 weights
 * on oneDNN, everything without bf16 scratch). */
static size_t bf16_op_bytes(const sim *m, size_t elems, bool weight) {
    if (!m->bf16_scratch || (weight && m->bf16_narrow)) return 0;
    return m->bf16_narrow ? (elems ? elems : 1) * 2 : act_bytes(elems);
}

/* Scratch that exists together for one operation and goes after it: elems[0..n), zeros skipped. */
static void act_transient(sim *m, const size_t *elems, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (elems[i]) act(m, elems[i]);
    for (size_t i = 0; i < n; i++)
        if (elems[i]) act_free(m, elems[i]);
}

/* ---- sizes ----------------------------------------------------------------------------------- */

/* The tp-local elements of a block's parameters (models/gpt.c, add_block): LayerNorms and the
 * row linears' biases replicated (6C), qkv, attention and MLP weights split over tp. */
static size_t block_numel(const gpt_shape *s) {
    return 6 * s->C + 4 * s->C * s->cl + 3 * s->cl + 2 * s->C * s->fl + s->fl;
}

/* The root's (add_root_params): wte's slice, wpe, ln_f. */
static size_t root_numel(const gpt_shape *s) { return s->vl * s->C + s->T * s->C + 2 * s->C; }

/* fsdp_unit.c, build_shard: padded to a multiple of the shard group, S per rank. */
static void unit_sizes(sim_unit *u, size_t total, int dp) {
    size_t n = (size_t)dp;
    u->padded = (total + n - 1) / n * n;
    u->S = u->padded / n;
}

/* The elements of the block's parameters that the model converts to f32 copies when they are
 * bf16 (gpt.c, block_matmul false: LayerNorms and biases). */
static size_t block_small_params(const gpt_shape *s, size_t out[8]) {
    size_t v[8] = {s->C, s->C, 3 * s->cl, s->C, s->C, s->C, s->fl, s->C};
    memcpy(out, v, sizeof v);
    return 8;
}

/* ---- FSDP (fsdp/fsdp_unit.c, fsdp/fsdp_schedule.c) ------------------------------------------- */

static bool reshards_after_forward(const sim *m, const sim_unit *u) {
    int r = m->plan->reshard_after_forward;
    return r >= 0 ? r != 0 : !u->root;
}

/* OFFLOAD (fsdp_offload.c, mt_fsdp_offload_stage_start): full offload stages a sharded unit's shard into a
 * device buffer (params) that lives until its all-gather has completed. */
static void stage_start(sim *m, sim_unit *u) {
    if (!u || u->off != MT_OFFLOAD_FULL || u->S == 0 || u->staged || u->full) return;
    alloc(m, MT_MEM_PARAMS, u->S * m->es_param);
    u->staged = true;
}

/* mt_fsdp_offload_gathered: the staged shard goes (gather complete, or a pass's end). */
static void gathered(sim *m, sim_unit *u) {
    if (!u->staged) return;
    release(m, MT_MEM_PARAMS, u->S * m->es_param);
    u->staged = false;
}

/* mt_fsdp_gather_aliases: one rank with f32 parameters, not offloaded, unshards into its master
 * shard (no full buffer). */
static bool gather_aliases(const sim *m, const sim_unit *u) {
    return m->plan->dp == 1 && m->plan->param_dtype == MT_F32 && !u->off;
}

/* mt_fsdp_grads_alias: one rank, no replicate group beyond itself, f32 reduction, not offloaded,
 * a synchronising backward: it adds into the gradient shard (zeroed by mt_zero_grad before each
 * step), no full gradient buffer and no reduce-scatter. Under accumulation the first
 * micro-batch does not synchronise, so its buffer is a full one, kept to the last. */
static bool grads_alias(const sim *m, const sim_unit *u) {
    return m->plan->dp == 1 && m->plan->replicate <= 1 && m->plan->reduce_dtype == MT_F32 &&
           !u->off && m->sync;
}

/* mt_fsdp_rs_into_shard: with more ranks under the same conditions the reduce-scatter writes the
 * (zeroed) gradient shard, no staging buffer. */
static bool rs_into_shard(const sim *m, const sim_unit *u) {
    return m->plan->dp > 1 && m->plan->replicate <= 1 && m->plan->reduce_dtype == MT_F32 &&
           !u->off;
}

/* mt_fsdp_unshard_issue: the full buffer (none when it aliases the master or maps the ranks'
 * shards), then (offload_stage_in) the staged shard. */
static void unshard(sim *m, sim_unit *u) {
    if (u->full) return;
    if (!gather_aliases(m, u) && !u->mapped) alloc(m, MT_MEM_PARAMS, u->padded * m->es_param);
    stage_start(m, u);
    u->full = true;
}

static void reshard(sim *m, sim_unit *u) {
    if (!u->full) return;
    if (!gather_aliases(m, u) && !u->mapped) release(m, MT_MEM_PARAMS, u->padded * m->es_param);
    u->full = false;
}

/* The unit after u in the recorded order: forward root, blocks 0..L-1; backward root, blocks
 * L-1..0. The replay is of a step after the first, when the order is recorded. */
static sim_unit *next_unit(sim *m, const sim_unit *u, bool backward) {
    size_t L = m->s.L, i = (size_t)(u - m->units); /* 0: root, 1 + l: block l */
    if (!backward) return i < L ? &m->units[i + 1] : NULL;
    if (i == 0) return &m->units[L];
    return i > 1 ? &m->units[i - 1] : NULL;
}

/* pre_hook / unshard_for: u's gather, then the prefetch of the next unit if it is sharded (and,
 * full offload, the staging of the unit after it), then the wait for u's gather. */
static void pre_hook(sim *m, sim_unit *u, bool backward) {
    unshard(m, u);
    sim_unit *next = m->plan->prefetch ? next_unit(m, u, backward) : NULL;
    if (next && !next->full) {
        unshard(m, next);
        stage_start(m, next_unit(m, next, backward));
    }
    gathered(m, u);
}

static void reshard_all(sim *m, bool keep_non_resharding) {
    for (size_t i = 0; i <= m->s.L; i++)
        if (!m->units[i].full) gathered(m, &m->units[i]); /* staged for a gather that never came */
    for (size_t i = 0; i <= m->s.L; i++)
        if (!keep_non_resharding || reshards_after_forward(m, &m->units[i]))
            reshard(m, &m->units[i]);
}

static void post_forward(sim *m, sim_unit *u) {
    if (reshards_after_forward(m, u)) reshard(m, u);
    if (u->root) reshard_all(m, true);
}

/* fsdp_offload.c, land: the reduced shard in flight to the host lands; its device buffer goes. */
static void land(sim *m) {
    if (!m->pending) return;
    release(m, MT_MEM_COMM, m->pending_recv);
    m->pending = false;
}

/* mt_fsdp_offload_grad_in: the previous shard lands, the landing block grows to this one
 * (freed, then allocated) and this shard's device buffer stays until it lands in turn. */
static void grad_in(sim *m, sim_unit *p) {
    size_t bytes = p->S * m->es_reduce;
    if (p->S == 0) {
        release(m, MT_MEM_COMM, bytes);
        return;
    }
    land(m);
    if (m->landing < bytes) {
        if (m->landing) mt_mem_timeline_free(&m->host, MT_MEM_COMM, m->landing);
        mt_mem_timeline_alloc(&m->host, MT_MEM_COMM, bytes);
        m->landing = bytes;
    }
    m->pending_recv = bytes;
    m->pending = true;
}

/* finish_rs: staging and the gradient buffer go (the HSDP all-reduce uses kept scratch); an
 * offloaded unit's received shard is handed to grad_in instead. */
static void finish_pending_rs(sim *m) {
    sim_unit *p = m->rs_pending;
    if (!p) return;
    m->rs_pending = NULL;
    if (p->off) grad_in(m, p);
    else if (!rs_into_shard(m, p)) release(m, MT_MEM_COMM, p->S * m->es_reduce);
    if (m->plan->reduce_dtype == MT_BF16) release(m, MT_MEM_COMM, p->padded * m->es_reduce);
    release(m, MT_MEM_GRADS, p->padded * sizeof(float));
    p->full_grad = false;
}

/* issue_rs: the received shard, and a bf16 copy of the gradient to send when reducing in bf16. */
static void issue_rs(sim *m, sim_unit *u) {
    if (!rs_into_shard(m, u)) alloc(m, MT_MEM_COMM, u->S * m->es_reduce);
    if (m->plan->reduce_dtype == MT_BF16) alloc(m, MT_MEM_COMM, u->padded * m->es_reduce);
    m->rs_pending = u;
}

static void pre_backward(sim *m, sim_unit *u) {
    pre_hook(m, u, true);
    if (m->rs_pending == u) finish_pending_rs(m);
    if (!u->full_grad) {
        u->grad_aliased = grads_alias(m, u);
        if (!u->grad_aliased) alloc(m, MT_MEM_GRADS, u->padded * sizeof(float));
        u->full_grad = true;
    }
}

/* Without sync (micro-batches before the last) the gradient buffer stays for the next. */
static void post_backward(sim *m, sim_unit *u) {
    if (m->sync) {
        finish_pending_rs(m);
        if (u->grad_aliased) u->full_grad = u->grad_aliased = false; /* in the shard */
        else issue_rs(m, u);
    }
    reshard(m, u);
    if (u->root) {
        finish_pending_rs(m);
        land(m); /* mt_fsdp_offload_grads_landed */
        reshard_all(m, false);
    }
}

/* ---- tp linears (tp/tp_linear.c) and bf16 products (core/cpu/ops_bf16.c) -------------------- */

/* SP (tp/tp_sequence.c): the floats one call takes from the tp context's kept scratch: its
 * gathered operand or partial sum (operand: N x C, every SP operand has C channels) and, for a
 * column linear's backward (part_fin: its input features, 0 otherwise), the input gradient's
 * N x fin part (gpt.c overwrites every column linear's input gradient, so its rows of the sum
 * are reduce-scattered into it, taking no scratch). */
static size_t sp_take_elems(const sim *m, bool operand, size_t part_fin) {
    return (operand ? m->s.N * m->s.C : 0) + m->s.N * part_fin;
}

/* The kept scratch is as large as the largest call's (it grows to it in the first step and stays
 * until the model goes): the re-gathering column backward, which takes its gathered input and its
 * part at once, or an operand alone. Every column linear reads C features. */
static size_t sp_kept_bytes(const sim *m) {
    size_t a = sp_take_elems(m, true, 0), b = sp_take_elems(m, !m->sp_keep, m->s.C);
    return act_bytes(a > b ? a : b);
}

/* A call that takes elems floats of the kept scratch: nothing is allocated (it is there). */
static void sp_take(sim *m, size_t elems) {
    if (elems && act_bytes(elems) > m->sp_kept) m->sp_short = true;
}

/* A linear forward of rows x fin -> fout: with bf16 weights on the CPU, the rounded input and the
 * widened weight exist during the product. SP: a column linear first gathers its input into a
 * temporary N x C (re-gather; kept gathered, column_forward keeps the buffer); a row
 * linear computes its N x C partial output in a temporary that is reduce-scattered into the
 * N / tp rows (tp/tp_sequence.c). */
static void linear_forward(sim *m, size_t rows, size_t fin, size_t fout, bool sp_temp) {
    sp_take(m, sp_temp ? sp_take_elems(m, true, 0) : 0);
    size_t scratch[2] = {bf16_op_bytes(m, rows * fin, false), bf16_op_bytes(m, fout * fin, true)};
    act_transient_bytes(m, scratch, 2);
}

/* A linear backward: gpt.c overwrites every linear's input gradient, so a column linear over
 * tp > 1 sums it over tp in place (mt_tp_column_linear_backward: no scratch), or with SP in an
 * N x fin part reduce-scattered into it (column_backward_full); bf16 rounds the output gradient
 * and the input and widens the weight. SP: the linear's replicated operand (the column input
 * unless kept gathered, the row output gradient) is gathered into a temporary N x C first. */
static void linear_backward(sim *m, size_t rows, size_t fin, size_t fout, bool column,
                            bool sp_temp) {
    if (m->sp) sp_take(m, sp_take_elems(m, sp_temp, column ? fin : 0));
    size_t scratch[3] = {bf16_op_bytes(m, rows * fout, false), bf16_op_bytes(m, rows * fin, false),
                         bf16_op_bytes(m, fout * fin, true)};
    act_transient_bytes(m, scratch, 3);
}

/* SP kept gathered (gpt.c, column_forward): a column linear's forward gathers its input into an
 * N x C buffer it keeps (ln1_full, ln2_full, lnf_full), then frees the input's rows x C (the
 * LayerNorm output ln1, ln2, lnf); otherwise the linear's forward alone. */
static void column_forward(sim *m, size_t fout) {
    const gpt_shape *s = &m->s;
    if (m->sp_keep) act(m, s->N * s->C);
    linear_forward(m, s->N, s->C, fout, m->sp && !m->sp_keep);
    if (m->sp_keep) act_free(m, s->rows * s->C);
}

/* SP: a pass's LayerNorm gradients, k x C zeroed scratch (gpt.c, ln_grads_begin), summed over
 * tp and freed after the LayerNorms' backward. */
static void ln_grads(sim *m, size_t k, bool free_it) {
    if (!m->sp) return;
    if (free_it) act_free(m, k * m->s.C);
    else act(m, k * m->s.C);
}

/* ---- the model (models/gpt.c) ---------------------------------------------------------------- */

/* mt_model_param_values: bf16 parameters that are not matmul weights get f32 copies. */
static void param_copies(sim *m, const size_t *elems, size_t n, bool free_them) {
    if (m->plan->param_dtype != MT_BF16) return;
    for (size_t i = 0; i < n; i++) {
        if (free_them) act_free(m, elems[i]);
        else act(m, elems[i]);
    }
}

/* block_acts, in block_alloc's order; SP: the LayerNorm outputs and statistics and the residual
 * stream hold rows = N / tp rows. */
#define BLOCK_ACTS 13
static void block_act_sizes(const gpt_shape *s, size_t out[BLOCK_ACTS]) {
    size_t N = s->N, r = s->rows, C = s->C;
    size_t v[BLOCK_ACTS] = {r * C, r, r, N * 3 * s->cl, s->B * s->hl * s->T * s->T, N * s->cl,
                            r * C, r * C, r, r, N * s->fl, N * s->fl, r * C};
    memcpy(out, v, sizeof v);
}
enum { ACT_LN1 = 0, ACT_LN2 = 7, ACT_RES_OUT = BLOCK_ACTS - 1 };

/* AC: a checkpointed block keeps only its output (the next block's input) after its
 * forward and recomputes the rest in its backward. MT_GPT_AC_EVERY checkpoints blocks 0, K, ... */
static bool checkpointed(const sim *m, size_t l) {
    switch (m->plan->activation_checkpointing) {
    case MT_GPT_AC_FULL: return true;
    case MT_GPT_AC_EVERY: return l % (size_t)m->plan->ac_every == 0;
    default: return false;
    }
}

/* block_forward_run's allocations after the saved activations: its four linears. */
static void block_forward_compute(sim *m) {
    const gpt_shape *s = &m->s;
    column_forward(m, 3 * s->cl);                /* qkv */
    linear_forward(m, s->N, s->cl, s->C, m->sp); /* attention projection, row */
    column_forward(m, s->fl);                    /* fc */
    linear_forward(m, s->N, s->fl, s->C, m->sp); /* MLP projection, row */
}

/* The block's saved activations go (all, or all but res_out for the AC discard); SP kept
 * gathered, ln1 and ln2 are their gathered N x C by then. */
static void block_acts_free(sim *m, const size_t *acts, size_t count) {
    for (size_t i = 0; i < count; i++) {
        bool gathered = m->sp_keep && (i == ACT_LN1 || i == ACT_LN2);
        act_free(m, gathered ? m->s.N * m->s.C : acts[i]);
    }
}

static void block_forward(sim *m, size_t l) {
    size_t small[8], acts[BLOCK_ACTS];
    size_t ns = block_small_params(&m->s, small);
    block_act_sizes(&m->s, acts);
    phase(m, "forward of block", l);
    pre_hook(m, &m->units[1 + l], false);
    param_copies(m, small, ns, false);
    for (size_t i = 0; i < BLOCK_ACTS; i++) act(m, acts[i]);
    block_forward_compute(m);
    param_copies(m, small, ns, true);
    if (checkpointed(m, l)) /* AC: the discard of all but the output */
        block_acts_free(m, acts, ACT_RES_OUT);
    post_forward(m, &m->units[1 + l]);
}

static void block_backward(sim *m, size_t l) {
    const gpt_shape *s = &m->s;
    size_t small[8], acts[BLOCK_ACTS];
    size_t ns = block_small_params(s, small), N = s->N, C = s->C, cl = s->cl, fl = s->fl;
    bool sp = m->sp, regather = m->sp && !m->sp_keep;
    block_act_sizes(s, acts);
    phase(m, "backward of block", l);
    pre_backward(m, &m->units[1 + l]);
    param_copies(m, small, ns, false);
    if (checkpointed(m, l)) { /* AC: the recomputed forward */
        for (size_t i = 0; i < ACT_RES_OUT; i++) act(m, acts[i]);
        block_forward_compute(m);
    }
    /* block_grads, in block_backward_run's order; SP: the LayerNorm input gradients are rows. */
    size_t d[6] = {N * fl, N * fl, s->rows * C, N * cl, N * 3 * cl, s->rows * C};
    for (size_t i = 0; i < 6; i++) act(m, d[i]);
    ln_grads(m, 4, false);
    linear_backward(m, N, fl, C, false, sp);          /* MLP projection, row */
    linear_backward(m, N, C, fl, true, regather);     /* fc, column */
    linear_backward(m, N, cl, C, false, sp);          /* attention projection, row */
    linear_backward(m, N, C, 3 * cl, true, regather); /* qkv, column */
    param_copies(m, small, ns, true);
    for (size_t i = 0; i < 6; i++) act_free(m, d[i]);
    ln_grads(m, 4, true);
    block_acts_free(m, acts, BLOCK_ACTS);
    post_backward(m, &m->units[1 + l]);
}

/* embed: wte and wpe read as f32 (copies when bf16), x0. SP: the lookup's N x C sum
 * in a temporary, reduce-scattered into x0's rows. */
static void embed(sim *m) {
    const gpt_shape *s = &m->s;
    size_t copies[2] = {s->vl * s->C, s->T * s->C};
    phase(m, "embedding", NO_INDEX);
    param_copies(m, copies, 2, false);
    act(m, s->rows * s->C);
    if (m->sp) sp_take(m, sp_take_elems(m, true, 0));
    param_copies(m, copies, 2, true);
}

/* head_forward: ln_f, logits, the loss gradient (kept for backward), the cross-entropy's
 * scratch of 4 floats per row. */
static void head_forward(sim *m) {
    const gpt_shape *s = &m->s;
    size_t lnf_params[2] = {s->C, s->C};
    phase(m, "head forward and loss", NO_INDEX);
    param_copies(m, lnf_params, 2, false);
    act(m, s->rows * s->C);
    act(m, s->rows);
    act(m, s->rows);
    act(m, s->N * s->V); /* logits */
    column_forward(m, s->V);
    act(m, s->N * s->V); /* d_logits */
    size_t xent = 4 * s->N;
    act_transient(m, &xent, 1);
    act_free(m, s->N * s->V);
    param_copies(m, lnf_params, 2, true);
}

/* head_backward: d_lnf, the head's column backward, d_res (the residual gradient, kept to the
 * end of the pass); then ln_f's activations and the loss gradient go. */
static void head_backward(sim *m) {
    const gpt_shape *s = &m->s;
    size_t lnf_w = s->C;
    phase(m, "head backward", NO_INDEX);
    param_copies(m, &lnf_w, 1, false);
    act(m, s->rows * s->C);
    linear_backward(m, s->N, s->C, s->V, true, m->sp && !m->sp_keep);
    act(m, s->rows * s->C); /* d_res */
    ln_grads(m, 2, false);
    ln_grads(m, 2, true);
    act_free(m, s->rows * s->C);
    param_copies(m, &lnf_w, 1, true);
    act_free(m, s->N * s->V);
    act_free(m, (m->sp_keep ? s->N : s->rows) * s->C); /* lnf, or lnf_full */
    act_free(m, s->rows);
    act_free(m, s->rows);
}

/* run_pass: pass_prepare's ids and targets, the root's forward and backward, pass_release. */
static void micro_batch(sim *m) {
    const gpt_shape *s = &m->s;
    sim_unit *root = &m->units[0];
    phase(m, "embedding", NO_INDEX);
    alloc(m, MT_MEM_ACTIVATIONS, 2 * s->N * sizeof(int));
    pre_hook(m, root, false);
    embed(m);
    for (size_t l = 0; l < s->L; l++) block_forward(m, l);
    head_forward(m);
    post_forward(m, root);
    phase(m, "head backward", NO_INDEX);
    pre_backward(m, root);
    head_backward(m);
    for (size_t l = s->L; l-- > 0;) block_backward(m, l);
    phase(m, "embedding backward", NO_INDEX);
    if (m->sp) { /* root_backward: d_res gathered for the embeddings, its rows freed */
        act(m, s->N * s->C);
        act_free(m, s->rows * s->C);
    }
    post_backward(m, root);
    act_free(m, s->rows * s->C);           /* x0 */
    act_free(m, (m->sp ? s->N : s->rows) * s->C); /* d_res */
    release(m, MT_MEM_ACTIVATIONS, 2 * s->N * sizeof(int));
}

/* ---- between steps --------------------------------------------------------------------------- */

/* The transport's scratch kept by each group after the first step (CPU device only): the shard
 * group's reduce-scatters and one-float all-reduces (the loss, the clip norm); tp's all-reduces
 * of N x C activations and gradients and the cross-entropy's row maxima and sums; the replicate
 * group's all-reduce of each reduced shard (HSDP). */
static size_t comm_scratch(const sim *m) {
    const mt_gpt_memory_plan *p = m->plan;
    const gpt_shape *s = &m->s;
    size_t small = p->comm_small_bytes ? p->comm_small_bytes : MT_COMM_SMALL_BYTES_DEFAULT;
    size_t dp = mt_comm_scratch_all_reduce(1, sizeof(float), p->dp, small), rep = 0, tp = 0;
    for (size_t i = 0; i <= s->L; i++) {
        size_t rs = mt_comm_scratch_reduce_scatter(m->units[i].S, m->es_reduce, p->dp, small);
        size_t ar = mt_comm_scratch_all_reduce(m->units[i].S, m->es_reduce, p->replicate, small);
        if (rs > dp) dp = rs;
        if (ar > rep) rep = ar;
    }
    /* SP: also the LayerNorm gradients' all-reduce, 4 x C per block (gpt.c, ln_grads_end). */
    size_t tp_counts[5] = {s->N * s->C, s->N, 2 * s->N, 1, m->sp ? 4 * s->C : 0};
    for (int i = 0; i < 5; i++) {
        size_t b = mt_comm_scratch_all_reduce(tp_counts[i], sizeof(float), p->tp, small);
        if (i == 0 && m->sp) /* SP: reduce-scatters to rows instead */
            b = mt_comm_scratch_reduce_scatter(s->rows * s->C, sizeof(float), p->tp, small);
        if (b > tp) tp = b;
    }
    return dp + tp + rep;
}

/* Shards (fsdp_unit.c, alloc_shards: the f32 master is the optimizer's with bf16 parameters),
 * AdamW's m and v (optim_adamw.c: made with the optimizer), the kept comm scratch. */
static void persistent(sim *m) {
    mt_mem_timeline_phase(&m->tl, "between steps");
    bool bf16 = m->plan->param_dtype == MT_BF16;
    for (size_t i = 0; i <= m->s.L; i++) {
        size_t S = m->units[i].S;
        if (m->units[i].off) { /* fsdp_offload.c, mt_fsdp_offload_alloc; optim_adamw.c */
            mt_mem_timeline *h = &m->host;
            mt_mem_timeline_alloc(h, bf16 ? MT_MEM_OPTIMIZER : MT_MEM_PARAMS, S * sizeof(float));
            mt_mem_timeline_alloc(h, MT_MEM_GRADS, S * sizeof(float));
            if (bf16) mt_mem_timeline_alloc(h, MT_MEM_PARAMS, S * sizeof(uint16_t));
            mt_mem_timeline_alloc(h, MT_MEM_OPTIMIZER, 2 * S * sizeof(float));
            /* optimizer: the device copy of the param_dtype shard the all-gathers read */
            if (m->units[i].off == MT_OFFLOAD_OPTIMIZER && S > 0)
                alloc(m, MT_MEM_PARAMS, S * m->es_param);
            continue;
        }
        alloc(m, bf16 ? MT_MEM_OPTIMIZER : MT_MEM_PARAMS, S * sizeof(float));
        if (bf16) alloc(m, MT_MEM_PARAMS, S * sizeof(uint16_t));
        alloc(m, MT_MEM_GRADS, S * sizeof(float));
        alloc(m, MT_MEM_OPTIMIZER, 2 * S * sizeof(float));
    }
    if (m->plan->cpu_device) alloc(m, MT_MEM_COMM, comm_scratch(m));
    if (m->sp) { /* tp/tp_sequence.c: the tp context's scratch, kept from the first step on */
        m->sp_kept = sp_kept_bytes(m);
        alloc(m, MT_MEM_ACTIVATIONS, m->sp_kept);
    }
}

/* ---- before the first step ------------------------------------------------------------------ */

/* The highest total while the model is built (mt_gpt_create: every tp-local parameter in f32),
 * each unit is sharded in turn (mt_fsdp_shard: the blocks, then the root; the shards are made
 * before the unit's parameters go) and AdamW makes its state. */
static size_t setup_peak(const sim *m) {
    bool bf16 = m->plan->param_dtype == MT_BF16;
    size_t L = m->s.L, numel[2] = {root_numel(&m->s), block_numel(&m->s)};
    /* Deferred (config.defer_init): the parameters have no storage until their shards exist;
     * on the CPU device the initialisers write into the shards in place. */
    if (m->defer_init) numel[0] = numel[1] = 0;
    size_t total = (numel[0] + L * numel[1]) * sizeof(float), peak = total;
    for (size_t k = 0; k <= L; k++) {
        size_t i = k < L ? 1 + k : 0; /* the blocks first, the root last */
        const sim_unit *u = &m->units[i];
        if (u->off == MT_OFFLOAD_OPTIMIZER && u->S > 0) total += u->S * m->es_param;
        else if (!u->off) total += u->S * (2 * sizeof(float) + (bf16 ? sizeof(uint16_t) : 0));
        if (total > peak) peak = total;
        total -= numel[i == 0 ? 0 : 1] * sizeof(float);
    }
    for (size_t i = 0; i <= L; i++) /* AdamW's state: offloaded units' in the host tier */
        if (!m->units[i].off) total += 2 * m->units[i].S * sizeof(float);
    return total > peak ? total : peak;
}

/* ---- checks and the entry point -------------------------------------------------------------- */

static mt_status check_plan(const mt_gpt_config *c, const mt_gpt_memory_plan *p) {
    static const char what[] = "mt_gpt_memory_predict";
    if (p->dp < 1 || p->replicate < 1 || p->tp < 1 || p->batch < 1 || p->grad_accum < 1)
        return mt_error(MT_ERR_INVALID_ARG, "%s: dp %d, replicate %d, tp %d, batch %d, "
                        "grad_accum %d: each must be >= 1", what, p->dp, p->replicate, p->tp,
                        p->batch, p->grad_accum);
    if ((p->param_dtype != MT_F32 && p->param_dtype != MT_BF16) ||
        (p->reduce_dtype != MT_F32 && p->reduce_dtype != MT_BF16))
        return mt_error(MT_ERR_INVALID_ARG, "%s: param_dtype and reduce_dtype must be MT_F32 or "
                        "MT_BF16", what);
    if (p->reshard_after_forward < -1 || p->reshard_after_forward > 1)
        return mt_error(MT_ERR_INVALID_ARG, "%s: reshard_after_forward %d must be 1, 0 or -1",
                        what, p->reshard_after_forward);
    if (p->activation_checkpointing < MT_GPT_AC_NONE ||
        p->activation_checkpointing > MT_GPT_AC_EVERY ||
        (p->activation_checkpointing == MT_GPT_AC_EVERY && p->ac_every < 1))
        return mt_error(MT_ERR_INVALID_ARG, "%s: activation checkpointing %d (every %d): not a "
                        "mode, or every K with K < 1", what, (int)p->activation_checkpointing,
                        p->ac_every);
    /* The model's own checks, with its messages: what it refuses is not predicted. */
    mt_status st = mt_gpt_config_check(c, p->tp, p->sequence_parallel);
    if (st != MT_OK) return mt_error_wrap(st, "%s", what);
    if (p->offload < MT_OFFLOAD_NONE || p->offload > MT_OFFLOAD_FULL ||
        !(p->offload_ratio >= 0.0f && p->offload_ratio <= 1.0f))
        return mt_error(MT_ERR_INVALID_ARG, "%s: offload %d with ratio %g: the policy must be an "
                        "mt_offload and the ratio in [0, 1]", what, p->offload,
                        (double)p->offload_ratio);
    return MT_OK;
}

/* fsdp_offload.c, mt_fsdp_offload_setup: the units are counted in sharding order (train_gpt and
 * the docs shard the blocks, then the root) and unit k is offloaded when the ratio's multiples
 * step over an integer. */
static void choose_offload(sim *m) {
    if (m->plan->offload == MT_OFFLOAD_NONE) return;
    double r = m->plan->offload_ratio;
    for (size_t k = 0; k <= m->s.L; k++) {
        sim_unit *u = &m->units[k < m->s.L ? 1 + k : 0];
        if (floor((double)(k + 1) * r) > floor((double)k * r)) u->off = m->plan->offload;
    }
}

/* fsdp_unit.c, mt_fsdp_shard and build_shard: with mapped_gather, on the CPU device, an f32
 * unit over more than one rank that is not offloaded pads its shard to whole pages when it is
 * large enough to be a shared block (fsdp/fsdp_mapped.h), and its gathers then map the ranks'
 * shards, assuming every rank can (one host, the shared-memory path on). */
static void map_units(sim *m, const size_t *totals) {
    const mt_gpt_memory_plan *p = m->plan;
    if (!p->mapped_gather || !p->cpu_device || p->dp < 2 || p->param_dtype != MT_F32) return;
    for (size_t i = 0; i <= m->s.L; i++) {
        sim_unit *u = &m->units[i];
        size_t S = u->off ? 0 : mt_fsdp_mapped_shard(totals[i], p->dp);
        if (S == 0) continue;
        u->S = S;
        u->padded = S * (size_t)p->dp;
        u->mapped = true;
    }
}

static gpt_shape shape_of(const mt_gpt_config *c, const mt_gpt_memory_plan *p) {
    gpt_shape s;
    size_t tp = (size_t)p->tp;
    s.L = (size_t)c->layers;
    s.C = (size_t)c->d_model;
    s.T = (size_t)c->seq;
    s.B = (size_t)p->batch;
    s.N = s.B * s.T;
    s.cl = s.C / tp;
    s.fl = 4 * s.C / tp;
    s.hl = (size_t)c->heads / tp;
    s.vl = ((size_t)c->vocab + tp - 1) / tp;
    s.V = s.vl < (size_t)c->vocab ? s.vl : (size_t)c->vocab;
    s.rows = p->sequence_parallel ? s.N / tp : s.N;
    s.tp = p->tp;
    return s;
}

mt_status mt_gpt_memory_predict(const mt_gpt_config *cfg, const mt_gpt_memory_plan *plan,
                                mt_gpt_memory_prediction *out) {
    if (!cfg || !plan || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_gpt_memory_predict: cfg, plan and out must not "
                        "be NULL");
    memset(out, 0, sizeof *out);
    MT_TRY(check_plan(cfg, plan));
    sim m;
    memset(&m, 0, sizeof m);
    m.plan = plan;
    m.s = shape_of(cfg, plan);
    m.bf16_scratch = plan->cpu_device && plan->param_dtype == MT_BF16;
    if (m.bf16_scratch) {
        mt_bf16_gemm_path path;
        MT_TRY(mt_cpu_bf16_gemm_path(&path, false));
        m.bf16_narrow = path == MT_BF16_GEMM_ONEDNN;
    }
    m.sp = plan->sequence_parallel && plan->tp > 1;
    m.sp_keep = m.sp && plan->sequence_parallel == MT_GPT_SP_KEEP_GATHERED;
    m.defer_init = cfg->defer_init;
    m.es_param = plan->param_dtype == MT_BF16 ? 2 : 4;
    m.es_reduce = plan->reduce_dtype == MT_BF16 ? 2 : 4;
    m.units = calloc(m.s.L + 1, sizeof *m.units);
    if (!m.units)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "mt_gpt_memory_predict: out of host memory for %d "
                        "units", cfg->layers + 1);
    m.units[0].root = true;
    size_t *totals = malloc((m.s.L + 1) * sizeof *totals);
    if (!totals) {
        free(m.units);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "mt_gpt_memory_predict: out of host memory");
    }
    for (size_t i = 0; i <= m.s.L; i++) {
        totals[i] = i == 0 ? root_numel(&m.s) : block_numel(&m.s);
        unit_sizes(&m.units[i], totals[i], plan->dp);
    }

    choose_offload(&m);
    map_units(&m, totals);
    free(totals);
    out->setup_peak = setup_peak(&m);
    persistent(&m);
    out->persistent = m.tl.total;
    for (int mb = 0; mb < plan->grad_accum; mb++) {
        m.sync = mb == plan->grad_accum - 1;
        m.mb = mb;
        micro_batch(&m);
    }
    /* mt_clip_grad_norm's accumulator; AdamW's update allocates nothing. */
    mt_mem_timeline_phase(&m.tl, "optimizer step");
    alloc(&m, MT_MEM_ACTIVATIONS, sizeof(double));
    release(&m, MT_MEM_ACTIVATIONS, sizeof(double));
    free(m.units);

    if (m.sp_short)
        return mt_error(MT_ERR_INTERNAL, "mt_gpt_memory_predict: a sequence-parallel call needs "
                        "more than the %zu bytes of kept tp scratch: a bug in "
                        "models/gpt_memory.c", m.sp_kept);
    if (m.tl.underflow || m.tl.total != out->persistent || m.host.underflow)
        return mt_error(MT_ERR_INTERNAL, "mt_gpt_memory_predict: the replayed step does not "
                        "free what it allocates (%zu bytes left of %zu): a bug in "
                        "models/gpt_memory.c", m.tl.total, out->persistent);
    memcpy(out->peak, m.tl.peak, sizeof out->peak);
    memcpy(out->at_total_peak, m.tl.at_total_peak, sizeof out->at_total_peak);
    out->total_peak = m.tl.total_peak;
    memcpy(out->host_peak, m.host.peak, sizeof out->host_peak);
    out->host_total_peak = m.host.total_peak;
    memcpy(out->total_peak_at, m.tl.total_peak_at, sizeof out->total_peak_at);
    return MT_OK;
}
