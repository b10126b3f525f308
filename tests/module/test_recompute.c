/* Activation recompute (module/recompute.c) on one process, no launcher:
 *   - refusals: a module without discard, a container without a forward, enabling twice,
 *     disabling what does not recompute;
 *   - with FSDP, in both orders of enabling (after mt_fsdp_shard: FSDP's hooks outside; before:
 *     inside): every recomputing module's forward runs twice per step and its discard once, and
 *     every unit is gathered as often as without recompute (once per step when it keeps its
 *     parameters after forward, twice when it reshards), with the forward order recorded alike;
 *   - the GPT: losses, gradients and parameters after AdamW steps bit for bit equal without
 *     recompute, with every block, every second block, and every block enabled before sharding;
 *     and the activation peak equal to the formula of docs/architecture.md, without and with.
 */
#include "check.h"
#include "core/error.h"
#include "fsdp/fsdp_internal.h"

#include <meshtrain/meshtrain.h>

#include <stdlib.h>
#include <string.h>

/* ---- a toy model: root -> l0, l1, l2 --------------------------------------------------------- */

#define NL 3

/* Per module function: how often it ran (the ctx of every call). */
typedef struct calls {
    int fwd[NL + 1], bwd[NL + 1], discard[NL + 1];
    bool saved[NL + 1]; /* the module's forward "saved activations" its backward needs */
} calls;

static int index_of(mt_module *m) { return (int)(intptr_t)mt_module_user(m); }

static mt_status need_params(mt_module *m, bool grads) {
    for (size_t i = 0; i < mt_module_param_count(m); i++) {
        mt_param *p = mt_module_param(m, i);
        if (!mt_param_data(p) || (grads && !mt_param_grad(p)))
            return mt_error(MT_ERR_INTERNAL, "'%s.%s' not gathered", mt_module_name(m),
                            mt_param_name(p));
    }
    return MT_OK;
}

static mt_status fwd(mt_module *m, void *ctx) {
    calls *c = ctx;
    int i = index_of(m);
    c->fwd[i]++;
    c->saved[i] = true;
    for (size_t k = 0; k < mt_module_child_count(m); k++)
        MT_TRY(mt_module_forward(mt_module_child(m, k), ctx));
    return need_params(m, false);
}

static mt_status bwd(mt_module *m, void *ctx) {
    calls *c = ctx;
    int i = index_of(m);
    c->bwd[i]++;
    if (!c->saved[i])
        return mt_error(MT_ERR_INTERNAL, "backward of '%s' without its saved activations",
                        mt_module_name(m));
    c->saved[i] = false;
    size_t n = mt_module_child_count(m);
    for (size_t k = 0; k < n; k++) MT_TRY(mt_module_backward(mt_module_child(m, n - 1 - k), ctx));
    MT_TRY(need_params(m, true));
    for (size_t j = 0; j < mt_module_param_count(m); j++) {
        mt_param *p = mt_module_param(m, j);
        for (size_t e = 0; e < mt_param_numel(p); e++) mt_param_grad(p)[e] += 1.0f;
    }
    return MT_OK;
}

static mt_status discard(mt_module *m, void *ctx) {
    calls *c = ctx;
    c->discard[index_of(m)]++;
    c->saved[index_of(m)] = false;
    return MT_OK;
}

typedef struct toy {
    mt_module *root, *l[NL];
} toy;

/* l1 keeps its parameters from forward to backward (reshard_after_forward 0), l0 and l2
 * reshard; the root keeps them (the default for the outermost unit). recompute: 0 none,
 * 1 enabled after sharding, 2 before. */
static mt_status toy_build(mt_mesh *mesh, int recompute, toy *t) {
    static const mt_module_ops root_ops = {.forward = fwd, .backward = bwd};
    static const mt_module_ops ops = {.forward = fwd, .backward = bwd, .discard = discard};
    static const char *names[NL] = {"l0", "l1", "l2"};
    const mt_tp_placement rep = {MT_TP_REPLICATE, 0};
    MT_TRY(mt_module_create(mesh, "root", &root_ops, (void *)(intptr_t)NL, &t->root));
    MT_TRY(mt_module_add_param(t->root, "r", 1, (int64_t[]){3}, rep, NULL));
    for (int i = 0; i < NL; i++) {
        MT_TRY(mt_module_create(mesh, names[i], &ops, (void *)(intptr_t)i, &t->l[i]));
        MT_TRY(mt_module_add_child(t->root, t->l[i]));
        MT_TRY(mt_module_add_param(t->l[i], "p", 1, (int64_t[]){4 + i}, rep, NULL));
        if (recompute == 2) MT_TRY(mt_recompute_enable(t->l[i]));
    }
    mt_fsdp_options o = mt_fsdp_defaults(mesh, "dp");
    for (int i = 0; i < NL; i++) {
        o.reshard_after_forward = i == 1 ? 0 : 1;
        MT_TRY(mt_fsdp_shard(t->l[i], &o));
    }
    o.reshard_after_forward = -1;
    MT_TRY(mt_fsdp_shard(t->root, &o));
    for (int i = 0; recompute == 1 && i < NL; i++) MT_TRY(mt_recompute_enable(t->l[i]));
    return MT_OK;
}

static void toy_counts(toy *t, const char *label, int recompute) {
    calls c = {0};
    const int steps = 3;
    for (int s = 0; s < steps; s++) {
        CHECK_OK(mt_module_forward(t->root, &c));
        CHECK_OK(mt_module_backward(t->root, &c));
    }
    for (int i = 0; i <= NL; i++) {
        bool rc = recompute && i < NL;
        CHECK_MSG(c.fwd[i] == steps * (rc ? 2 : 1) && c.bwd[i] == steps &&
                  c.discard[i] == (rc ? steps : 0), "%s, module %d: %d forwards, %d backwards, "
                  "%d discards in %d steps", label, i, c.fwd[i], c.bwd[i], c.discard[i], steps);
        mt_module *m = i < NL ? t->l[i] : t->root;
        mt_fsdp_debug d = {0};
        CHECK_OK(mt_fsdp_debug_get(m, &d));
        /* l1 and the root keep their parameters from forward to backward: one gather a step. */
        long want = (i == 1 || i == NL) ? steps : 2 * steps;
        CHECK_MSG(d.all_gathers == want && d.reduce_scatters == steps, "%s, unit '%s': %ld "
                  "all-gathers, %ld reduce-scatters in %d steps, want %ld and %d", label,
                  mt_module_name(m), d.all_gathers, d.reduce_scatters, steps, want, steps);
        CHECK_MSG(mt_recompute_enabled(m) == rc, "%s: '%s' recomputes: %d", label,
                  mt_module_name(m), (int)mt_recompute_enabled(m));
    }
    mt_module *order[8];
    size_t n = 0;
    CHECK_OK(mt_fsdp_debug_order(t->root, false, order, 8, &n));
    CHECK_MSG(n == NL + 1 && order[0] == t->root && order[1] == t->l[0] && order[2] == t->l[1] &&
              order[3] == t->l[2], "%s: forward order of %zu units", label, n);
    CHECK_MSG(t->root->recomputing == 0 && t->l[0]->recomputing == 0 && t->l[0]->ctx == NULL,
              "%s: recompute state left behind", label);
}

static void check_fsdp_orders(mt_mesh *mesh) {
    static const char *labels[3] = {"no recompute", "recompute enabled after sharding",
                                    "recompute enabled before sharding"};
    for (int r = 0; r < 3; r++) {
        toy t = {0};
        mt_status st = toy_build(mesh, r, &t);
        CHECK_MSG(st == MT_OK, "%s: building: %s", labels[r], mt_last_error());
        if (st == MT_OK) toy_counts(&t, labels[r], r);
        mt_module_destroy(t.root);
    }
}

static void expect_refused(mt_status st, const char *what, const char *text) {
    CHECK_MSG(st == MT_ERR_INVALID_ARG && strstr(mt_last_error(), text), "%s: status %d, "
              "message '%s', want one containing '%s'", what, (int)st, mt_last_error(), text);
    mt_clear_error();
}

static void check_refusals(mt_mesh *mesh) {
    static const mt_module_ops no_discard = {.forward = fwd, .backward = bwd};
    static const mt_module_ops ops = {.forward = fwd, .backward = bwd, .discard = discard};
    mt_module *a = NULL, *box = NULL, *b = NULL;
    CHECK_OK(mt_module_create(mesh, "plain", &no_discard, NULL, &a));
    expect_refused(mt_recompute_enable(a), "no discard",
                   "module 'plain' has no discard function; activation recompute needs a "
                   "forward that can be re-run");
    CHECK(!mt_recompute_enabled(a));
    CHECK_OK(mt_module_create(mesh, "box", NULL, NULL, &box));
    CHECK_OK(mt_module_create(mesh, "inner", &ops, NULL, &b));
    CHECK_OK(mt_module_add_child(box, b));
    expect_refused(mt_recompute_enable(box), "container",
                   "module 'box' has no forward function of its own (it runs its children); "
                   "enable activation recompute on the children");
    CHECK_OK(mt_recompute_enable(b));
    expect_refused(mt_recompute_enable(b), "twice",
                   "module 'inner' already recomputes its activations");
    CHECK_OK(mt_recompute_disable(b));
    CHECK(!mt_recompute_enabled(b));
    expect_refused(mt_recompute_disable(b), "disable twice",
                   "module 'inner' does not recompute its activations");
    expect_refused(mt_recompute_enable(NULL), "NULL", "module is NULL");
    CHECK_OK(mt_recompute_enable(b)); /* released with the tree */
    mt_module_destroy(a);
    mt_module_destroy(box);
}

/* ---- a recompute forward that fails ---------------------------------------------------------- */

static int flaky_calls;

/* Succeeds once (the step's forward), fails the second time (recompute's re-run). */
static mt_status flaky_fwd(mt_module *m, void *ctx) {
    (void)ctx;
    if (++flaky_calls == 2) return mt_error_set(MT_ERR_INTERNAL, "re-run refused");
    return need_params(m, false);
}

static mt_status flaky_bwd(mt_module *m, void *ctx) {
    (void)ctx;
    return need_params(m, true);
}

static mt_status flaky_discard(mt_module *m, void *ctx) {
    (void)m, (void)ctx;
    return MT_OK;
}

/* The re-run fails in the backward: the backward reports it, naming the module, and the unit
 * is sharded again afterwards in both orders of enabling (FSDP inside recompute's
 * registration: only FSDP's post-forward sees the failure, its post-backward never runs). */
static void check_failed_rerun(mt_mesh *mesh, mt_device *dev) {
    static const mt_module_ops ops = {.forward = flaky_fwd, .backward = flaky_bwd,
                                      .discard = flaky_discard};
    for (int before = 0; before < 2; before++) {
        const char *label = before ? "recompute enabled before sharding (FSDP inside)"
                                   : "recompute enabled after sharding (FSDP outside)";
        mt_module *m = NULL;
        mt_mem_stats s0, s1;
        mt_device_mem_stats(dev, &s0);
        CHECK_OK(mt_module_create(mesh, "flaky", &ops, NULL, &m));
        CHECK_OK(mt_module_add_param(m, "p", 1, (int64_t[]){1000},
                                     (mt_tp_placement){MT_TP_REPLICATE, 0}, NULL));
        if (before) CHECK_OK(mt_recompute_enable(m));
        mt_fsdp_options o = mt_fsdp_defaults(mesh, "dp");
        o.reshard_after_forward = 1;
        CHECK_OK(mt_fsdp_shard(m, &o));
        if (!before) CHECK_OK(mt_recompute_enable(m));
        mt_device_mem_stats(dev, &s0);
        size_t sharded = s0.current[MT_MEM_PARAMS];
        flaky_calls = 0;
        CHECK_OK(mt_module_forward(m, NULL));
        mt_status st = mt_module_backward(m, NULL);
        CHECK_MSG(st == MT_ERR_INTERNAL && strstr(mt_last_error(), "re-run refused") &&
                      strstr(mt_last_error(), "'flaky'"),
                  "%s: backward %d, '%s'", label, (int)st, mt_last_error());
        mt_device_mem_stats(dev, &s1);
        mt_fsdp_unit *u = mt_fsdp_unit_of(m);
        CHECK_MSG(u && u->state == MT_UNIT_SHARDED && u->full == NULL, "%s: unit left gathered",
                  label);
        CHECK_MSG(s1.current[MT_MEM_PARAMS] == sharded, "%s: params %zu bytes after the failed "
                  "backward, %zu sharded", label, s1.current[MT_MEM_PARAMS], sharded);
        mt_clear_error();
        mt_module_destroy(m);
    }
}

/* ---- the GPT ----------------------------------------------------------------------------- */

enum { LAYERS = 4, DM = 32, HEADS = 4, SEQ = 16, VOCAB = 64, BATCH = 2, STEPS = 3 };

/* What one run ends with: every step's loss, the gradients of the last step and the
 * parameters after its optimizer step, all units' shards back to back; and the activation
 * peak of the last step. */
typedef struct gpt_run {
    float loss[STEPS];
    float *grads, *params;
    size_t n;
    size_t act_peak;
} gpt_run;

/* mode: 0 none, K > 0 every K-th block after sharding, -1 every block before sharding. */
static mt_status gpt_train(mt_mesh *mesh, int mode, gpt_run *out) {
    mt_device *dev = mt_runtime_device(mt_mesh_runtime(mesh));
    mt_gpt_config cfg = {.layers = LAYERS, .d_model = DM, .heads = HEADS, .seq = SEQ,
                         .vocab = VOCAB, .seed = 5};
    mt_gpt *g = NULL;
    mt_adamw *adam = NULL;
    mt_fsdp_shard_view *views = NULL;
    size_t nv = 0;
    int tokens[BATCH * (SEQ + 1)];
    mt_status st = mt_gpt_create(mesh, &cfg, &g);
    for (int l = 0; st == MT_OK && mode < 0 && l < LAYERS; l++)
        st = mt_recompute_enable(mt_gpt_block(g, l));
    mt_fsdp_options o = mt_fsdp_defaults(mesh, "dp");
    for (int l = 0; st == MT_OK && l < LAYERS; l++) st = mt_fsdp_shard(mt_gpt_block(g, l), &o);
    if (st == MT_OK) st = mt_fsdp_shard(mt_gpt_root(g), &o);
    for (int l = 0; st == MT_OK && mode > 0 && l < LAYERS; l += mode)
        st = mt_recompute_enable(mt_gpt_block(g, l));
    mt_adamw_options ao = {.lr = 1e-2f};
    if (st == MT_OK) st = mt_adamw_create(mt_gpt_root(g), &ao, &adam);
    for (int s = 0; st == MT_OK && s < STEPS; s++) {
        for (int i = 0; i < BATCH * (SEQ + 1); i++) tokens[i] = (i * 7 + s * 13 + i / 5) % VOCAB;
        mt_device_reset_peaks(dev);
        size_t before = 0;
        mt_mem_stats ms;
        mt_device_mem_stats(dev, &ms);
        before = ms.current[MT_MEM_ACTIVATIONS];
        st = mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &out->loss[s]);
        mt_device_mem_stats(dev, &ms);
        out->act_peak = ms.peak[MT_MEM_ACTIVATIONS] - before;
        if (st == MT_OK && s == STEPS - 1) st = mt_fsdp_collect_shards(mt_gpt_root(g), &views, &nv);
        for (size_t u = 0; st == MT_OK && u < nv; u++) out->n += views[u].n;
        if (st == MT_OK && s == STEPS - 1) {
            out->grads = malloc(out->n * sizeof(float));
            out->params = malloc(out->n * sizeof(float));
            if (!out->grads || !out->params) st = mt_error(MT_ERR_OUT_OF_MEMORY, "test: no memory");
        }
        size_t at = 0;
        for (size_t u = 0; st == MT_OK && views && u < nv; at += views[u++].n)
            st = mt_device_copy(dev, out->grads + at, views[u].grad, views[u].n * sizeof(float),
                                MT_COPY_DEVICE_TO_HOST, NULL);
        if (st == MT_OK) st = mt_adamw_step(adam);
        at = 0;
        for (size_t u = 0; st == MT_OK && views && u < nv; at += views[u++].n)
            st = mt_device_copy(dev, out->params + at, views[u].param, views[u].n * sizeof(float),
                                MT_COPY_DEVICE_TO_HOST, NULL);
        if (st == MT_OK) st = mt_zero_grad(mt_gpt_root(g));
    }
    free(views);
    mt_adamw_destroy(adam);
    mt_gpt_destroy(g);
    return st;
}

/* docs/architecture.md: the activation bytes of a step of the GPT (f32, tp 1), from what
 * models/gpt.c allocates. n = batch x seq rows; per block: ln1, ln2, res_mid, res_out (n x C
 * each), four row statistics (n), qkv (3 n C), the attention output (n C), fc and its GELU (4 n C
 * each) and the attention probabilities (batch x heads x seq x seq). */
static size_t gpt_act_formula(bool recompute) {
    size_t n = (size_t)BATCH * SEQ, C = DM, F = 4 * (size_t)DM, v = VOCAB;
    size_t att = (size_t)BATCH * HEADS * SEQ * SEQ;
    size_t block = 4 * n * C + 4 * n + 4 * n * C + 2 * n * F + att; /* A */
    size_t out = n * C;                                              /* R: res_out */
    size_t base = 2 * n /* ids, targets (int) */ + n * C /* x0 */;
    size_t head_fwd = n * C + 2 * n + 2 * n * v;     /* ln_f, its statistics, logits, d_logits */
    size_t head_bwd = n * v + n * C + 2 * n + 2 * n * C; /* d_logits, ln_f, d_lnf, d_res */
    size_t grads = 2 * n * F + 2 * n * C + 4 * n * C;   /* a block backward's scratch */
    size_t top_bwd = n * C + grads;                      /* d_res and the scratch */
    size_t kept = recompute ? LAYERS * out : LAYERS * block;
    size_t extra = head_fwd > head_bwd ? head_fwd : head_bwd;
    size_t blk = recompute ? block - out + top_bwd : top_bwd;
    if (blk > extra) extra = blk;
    return 4 * (base + kept + extra);
}

static void check_gpt(mt_mesh *mesh) {
    static const int modes[] = {0, 1, 2, -1};
    static const char *labels[] = {"none", "every block", "every 2nd block",
                                   "every block, enabled before sharding"};
    gpt_run runs[4];
    memset(runs, 0, sizeof runs);
    for (int m = 0; m < 4; m++)
        CHECK_MSG(gpt_train(mesh, modes[m], &runs[m]) == MT_OK, "gpt, %s: %s", labels[m],
                  mt_last_error());
    for (int m = 1; m < 4; m++) {
        CHECK_MSG(memcmp(runs[m].loss, runs[0].loss, sizeof runs[0].loss) == 0,
                  "gpt, %s: losses %.9g %.9g %.9g, without recompute %.9g %.9g %.9g", labels[m],
                  (double)runs[m].loss[0], (double)runs[m].loss[1], (double)runs[m].loss[2],
                  (double)runs[0].loss[0], (double)runs[0].loss[1], (double)runs[0].loss[2]);
        bool same = runs[m].n == runs[0].n && runs[0].grads && runs[m].grads &&
                    memcmp(runs[m].grads, runs[0].grads, runs[0].n * sizeof(float)) == 0 &&
                    memcmp(runs[m].params, runs[0].params, runs[0].n * sizeof(float)) == 0;
        CHECK_MSG(same, "gpt, %s: gradients or parameters differ from those without recompute",
                  labels[m]);
    }
    size_t want_none = gpt_act_formula(false), want_full = gpt_act_formula(true);
    printf("activation peak: none %zu bytes (formula %zu), full %zu bytes (formula %zu)\n",
           runs[0].act_peak, want_none, runs[1].act_peak, want_full);
    CHECK_MSG(runs[0].act_peak == want_none, "activation peak without recompute: %zu bytes, "
              "formula %zu", runs[0].act_peak, want_none);
    CHECK_MSG(runs[1].act_peak == want_full && runs[3].act_peak == want_full,
              "activation peak with recompute: %zu bytes (enabled before sharding: %zu), formula "
              "%zu", runs[1].act_peak, runs[3].act_peak, want_full);
    CHECK_MSG(runs[1].act_peak < runs[2].act_peak && runs[2].act_peak < runs[0].act_peak,
              "activation peaks: full %zu, every 2nd %zu, none %zu", runs[1].act_peak,
              runs[2].act_peak, runs[0].act_peak);
    for (int m = 0; m < 4; m++) {
        free(runs[m].grads);
        free(runs[m].params);
    }
}

int main(void) {
    mt_runtime *rt = NULL;
    CHECK_OK(mt_init(&rt, NULL, NULL));
    if (!rt) return check_report("test_recompute");
    mt_device *dev = mt_runtime_device(rt);
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 1, (int[]){1}, (const char *[]){"dp"}, &mesh));
    if (mesh) {
        check_refusals(mesh);
        check_fsdp_orders(mesh);
        check_failed_rerun(mesh, dev);
        check_gpt(mesh);
    }
    mt_mem_stats ms;
    mt_device_mem_stats(dev, &ms);
    CHECK_MSG(ms.current[MT_MEM_ACTIVATIONS] == 0 && ms.current[MT_MEM_PARAMS] == 0,
              "at the end: activations %zu, params %zu bytes", ms.current[MT_MEM_ACTIVATIONS],
              ms.current[MT_MEM_PARAMS]);
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    return check_report("test_recompute");
}
