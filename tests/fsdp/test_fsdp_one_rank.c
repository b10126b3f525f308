/* FSDP at one rank (fsdp_unit.c mt_fsdp_gather_aliases, fsdp_schedule.c mt_fsdp_grads_alias):
 * the shard is the whole flat buffer, so the engine neither gathers into a second buffer nor
 * reduces through one. Checked on a small GPT, no launcher:
 *   - the gradient shards after one step equal, bit for bit, the gradients the same GPT computes
 *     unsharded (its module functions with no FSDP hook, gradients in plain buffers);
 *   - no full parameter or gradient buffer exists during that step: the params and grads peaks
 *     are the shards' bytes, comm stays 0;
 *   - a second backward without mt_zero_grad (the shard holds g, not zeros) goes through a
 *     separate buffer as before: the shard becomes g + g exactly, not the sum re-associated.
 *     That buffer is not zeroed (fsdp_schedule.c grad_buffer): a hook inside FSDP's fills every
 *     gradient still unwritten with NaN before the GPT's backward, so g + g also says that the
 *     GPT's first write of each gradient overwrote all of it (mt_param_grad_write);
 *   - after mt_zero_grad, which only marks the shards (grad_shard_lazy: the backward's first
 *     writers overwrite them, marked unwritten and NaN-filled by the hook below), the step
 *     writes in place again and gives g once more;
 *   - clipping on the CPU device writes no gradient (fsdp/fsdp_shards.h, mt_fsdp_scale_grads):
 *     the factor waits on each unit, AdamW's step applies it as it reads (parameters, m and v
 *     bit for bit those of mt_op_scale then mt_op_adamw on copies), and a later reader of the
 *     shards gets g * c written, bit for bit;
 *   - the protocol for modules that do not overwrite: a module whose backward adds through
 *     mt_param_grad into one parameter, leaves one alone and overwrites a third through
 *     mt_param_grad_write, over a NaN-filled buffer, two micro-batches (sync off, then on):
 *     1 + 1, exactly 0, and 5 + 5, and the overwrite flag true on the first backward only.
 */
#include "check.h"
#include "fsdp/fsdp_internal.h"
#include "fsdp/fsdp_shards.h"
#include "module/module_internal.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS 2
#define BATCH 2

static const mt_gpt_config cfg = {.layers = LAYERS, .d_model = 32, .heads = 4, .seq = 8,
                                  .vocab = 40, .seed = 11};

/* The parameters of m's subtree in FSDP's unit layout order (own first, then the children's;
 * every child here is a unit of its own only for the root, handled by the caller). */
static void point_grads(mt_module *m, float *grads, size_t *at, bool recurse) {
    for (size_t i = 0; i < mt_module_param_count(m); i++) {
        mt_param *p = mt_module_param(m, i);
        p->grad = grads ? grads + *at : NULL;
        *at += mt_param_numel(p);
    }
    for (size_t i = 0; recurse && i < m->n_children; i++)
        point_grads(m->children[i], grads, at, true);
}

/* The unsharded GPT's gradients of one forward and backward, laid out unit by unit as FSDP lays
 * out its shards (blocks in order, then the root's own parameters). */
static float *reference_grads(mt_mesh *mesh, const int *tokens, size_t total) {
    mt_gpt *g = NULL;
    float *grads = calloc(total, sizeof *grads);
    CHECK_OK(mt_gpt_create(mesh, &cfg, &g));
    if (!g || !grads) {
        mt_gpt_destroy(g);
        free(grads);
        return NULL;
    }
    size_t at = 0;
    for (int l = 0; l < LAYERS; l++) point_grads(mt_gpt_block(g, l), grads, &at, true);
    point_grads(mt_gpt_root(g), grads, &at, false);
    CHECK_MSG(at == total, "%zu gradient elements, FSDP's shards hold %zu", at, total);
    float loss;
    CHECK_OK(mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss));
    at = 0;
    for (int l = 0; l < LAYERS; l++) point_grads(mt_gpt_block(g, l), NULL, &at, true);
    point_grads(mt_gpt_root(g), NULL, &at, false);
    mt_gpt_destroy(g);
    return grads;
}

/* The shards' gradients, concatenated (one rank: no padding, S is each unit's size). */
static void shard_grads(mt_module *root, float *out, size_t total) {
    mt_fsdp_shard_view *v = NULL;
    size_t n = 0, at = 0;
    CHECK_OK(mt_fsdp_collect_shards(root, &v, &n));
    for (size_t u = 0; u < n && at + v[u].n <= total; u++) {
        memcpy(out + at, v[u].grad, v[u].n * sizeof *out);
        at += v[u].n;
    }
    CHECK_MSG(at == total, "shards hold %zu elements, expected %zu", at, total);
    free(v);
}

/* A pre-backward hook registered after FSDP's (so inside it): every gradient FSDP handed out
 * unwritten is filled with NaN, what an uninitialised buffer may hold. */
static const char poison_owner = 0;

static mt_status poison_unwritten(mt_module *m, void *user) {
    (void)user;
    for (size_t i = 0; i < mt_module_param_count(m); i++) {
        mt_param *p = mt_module_param(m, i);
        if (!p->grad || !p->grad_unwritten) continue;
        for (size_t k = 0; k < p->numel; k++) p->grad[k] = NAN;
    }
    return MT_OK;
}

static void add_poison(mt_module *m) {
    static const mt_module_hooks h = {.pre_backward = poison_unwritten};
    CHECK_OK(mt_module_add_hooks(m, &poison_owner, &h, NULL));
}

static size_t count_mismatch(const float *a, const float *b, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&a[i], &b[i], sizeof *a) != 0;
    return bad;
}

/* The shards' gradients hold g (ref): clip to a tenth of their norm, then one AdamW step. */
static void check_deferred_clip(mt_device *dev, mt_module *root, const float *ref, size_t total) {
    enum { UNITS = LAYERS + 1 };
    const mt_adamw_options ao = {.lr = 1e-2f, .weight_decay = 0.1f};
    /* Created first, as a training program does: creating it reads (and so writes) the shards. */
    mt_adamw *opt = NULL;
    CHECK_OK(mt_adamw_create(root, &ao, &opt));
    float norm = 0.0f;
    CHECK_OK(mt_clip_grad_norm(root, 0.0f, &norm)); /* the norm alone */
    float max_norm = norm / 10.0f;
    CHECK_OK(mt_clip_grad_norm(root, max_norm, &norm));
    float c = (float)((double)max_norm / ((double)norm + 1e-6));
    mt_fsdp_shard_view *v = NULL;
    size_t n = 0, at = 0;
    CHECK_OK(mt_fsdp_collect_shards_for_step(root, &v, &n));
    CHECK_MSG(n == UNITS, "%zu units, expected %d", n, UNITS);
    float *p0 = malloc(total * sizeof *p0), *g = malloc(total * sizeof *g);
    float *m = calloc(total, sizeof *m), *vv = calloc(total, sizeof *vv);
    if (!p0 || !g || !m || !vv || !opt || n != UNITS) goto out;
    for (size_t u = 0; u < n; u++) {
        CHECK_MSG(v[u].grad_scale == c, "unit %zu: deferred factor %.9g, the clip's is %.9g", u,
                  (double)v[u].grad_scale, (double)c);
        CHECK_MSG(count_mismatch(v[u].grad, ref + at, v[u].n) == 0,
                  "unit %zu: the clip wrote the gradient shard", u);
        memcpy(p0 + at, v[u].param, v[u].n * sizeof *p0);
        at += v[u].n;
    }
    /* The reference: the old route, scale then step, on copies. */
    for (size_t i = 0; i < total; i++) g[i] = ref[i];
    CHECK_OK(mt_op_scale(dev, g, c, total));
    at = 0;
    for (size_t u = 0; u < n; u++) {
        CHECK_OK(mt_op_adamw(dev, p0 + at, g + at, m + at, vv + at, v[u].n, 1, ao.lr, 0.9f,
                             0.999f, 1e-8f, ao.weight_decay));
        at += v[u].n;
    }
    if (opt) CHECK_OK(mt_adamw_step(opt));
    at = 0;
    for (size_t u = 0; opt && u < n; u++) {
        float *em = NULL, *ev = NULL;
        size_t en = 0;
        CHECK_OK(mt_adamw_state(opt, u, &em, &ev, &en));
        CHECK_MSG(en == v[u].n && count_mismatch(v[u].param, p0 + at, en) == 0 &&
                      count_mismatch(em, m + at, en) == 0 && count_mismatch(ev, vv + at, en) == 0,
                  "unit %zu: the step on the deferred factor differs from scale + step", u);
        at += v[u].n;
    }
    free(v);
    /* Any other reader gets the scaled gradient written. */
    v = NULL;
    CHECK_OK(mt_fsdp_collect_shards(root, &v, &n));
    at = 0;
    for (size_t u = 0; v && u < n; u++) {
        CHECK_MSG(v[u].grad_scale == 1.0f && count_mismatch(v[u].grad, g + at, v[u].n) == 0,
                  "unit %zu: the shard read after the step is not g * c", u);
        at += v[u].n;
    }
out:
    mt_adamw_destroy(opt);
    free(v);
    free(p0);
    free(g);
    free(m);
    free(vv);
}

/* The module of the protocol check: params a, b, c (4 elements each). */
typedef struct proto_state {
    mt_param *p[3];
    bool overwrote[2];
    int backwards;
} proto_state;

static mt_status proto_forward(mt_module *m, void *ctx) {
    (void)m;
    (void)ctx;
    return MT_OK;
}

static mt_status proto_backward(mt_module *m, void *ctx) {
    (void)ctx;
    proto_state *s = mt_module_user(m);
    float *a = mt_param_grad(s->p[0]); /* adds: handed out zeroed */
    bool ow = false;
    float *c = mt_param_grad_write(s->p[2], &ow);
    if (!a || !c) return mt_error_set(MT_ERR_INTERNAL, "proto: no gradient");
    for (int k = 0; k < 4; k++) {
        a[k] += 1.0f;
        c[k] = ow ? 5.0f : c[k] + 5.0f;
    }
    if (s->backwards < 2) s->overwrote[s->backwards] = ow;
    s->backwards++;
    return MT_OK;
}

static void check_protocol(mt_mesh *mesh) {
    static const mt_module_ops ops = {.forward = proto_forward, .backward = proto_backward};
    proto_state s = {0};
    mt_module *m = NULL;
    CHECK_OK(mt_module_create(mesh, "proto", &ops, &s, &m));
    if (!m) return;
    const char *names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++)
        CHECK_OK(mt_module_add_param(m, names[i], 1, (int64_t[]){4},
                                     (mt_tp_placement){MT_TP_REPLICATE, 0}, &s.p[i]));
    mt_fsdp_options fo = mt_fsdp_defaults(mesh, "dp");
    CHECK_OK(mt_fsdp_shard(m, &fo));
    add_poison(m);
    CHECK_OK(mt_fsdp_set_requires_gradient_sync(m, false));
    CHECK_OK(mt_module_forward(m, NULL));
    CHECK_OK(mt_module_backward(m, NULL));
    CHECK_OK(mt_fsdp_set_requires_gradient_sync(m, true));
    CHECK_OK(mt_module_forward(m, NULL));
    CHECK_OK(mt_module_backward(m, NULL));
    mt_fsdp_shard_view *v = NULL;
    size_t n = 0;
    CHECK_OK(mt_fsdp_collect_shards(m, &v, &n));
    if (n == 1 && v[0].n == 12) {
        const float *g = v[0].grad;
        int bad = 0;
        for (int k = 0; k < 4; k++) {
            bad += g[k] != 2.0f;
            bad += memcmp(&g[4 + k], &(float){0.0f}, sizeof(float)) != 0;
            bad += g[8 + k] != 10.0f;
        }
        CHECK_MSG(bad == 0, "protocol: gradients a %g, b %g, c %g (want 2, 0, 10)", g[0], g[4],
                  g[8]);
    } else {
        CHECK_MSG(false, "protocol: %zu units, %zu elements (want 1 unit of 12)", n,
                  n ? v[0].n : 0);
    }
    free(v);
    CHECK_MSG(s.backwards == 2 && s.overwrote[0] && !s.overwrote[1], "protocol: %d backwards, "
              "overwrite flags %d %d (want 2 backwards, 1 then 0)", s.backwards, s.overwrote[0],
              s.overwrote[1]);
    mt_module_destroy(m);
}

int main(void) {
    mt_runtime *rt = NULL;
    CHECK_OK(mt_init(&rt, NULL, NULL));
    if (!rt) return check_report("test_fsdp_one_rank");
    mt_device *dev = mt_runtime_device(rt);
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 2, (int[]){1, 1}, (const char *[]){"dp", "tp"}, &mesh));
    int tokens[BATCH * 9];
    for (int i = 0; i < BATCH * 9; i++) tokens[i] = (i * 7 + 3) % cfg.vocab;

    mt_gpt *g = NULL;
    CHECK_OK(mt_gpt_create(mesh, &cfg, &g));
    mt_fsdp_options fo = mt_fsdp_defaults(mesh, "dp");
    for (int l = 0; g && l < LAYERS; l++) CHECK_OK(mt_fsdp_shard(mt_gpt_block(g, l), &fo));
    if (g) CHECK_OK(mt_fsdp_shard(mt_gpt_root(g), &fo));
    for (int l = 0; g && l < LAYERS; l++) add_poison(mt_gpt_block(g, l));
    if (g) add_poison(mt_gpt_root(g));
    mt_module *root = mt_gpt_root(g);
    mt_fsdp_shard_view *v = NULL;
    size_t n_units = 0, total = 0;
    if (g) CHECK_OK(mt_fsdp_collect_shards(root, &v, &n_units));
    for (size_t u = 0; u < n_units; u++) total += v[u].n;
    free(v);
    CHECK_MSG(total == mt_gpt_param_count(g), "shards %zu, parameters %zu", total,
              mt_gpt_param_count(g));

    float *ref = reference_grads(mesh, tokens, total);
    float *got = calloc(total ? total : 1, sizeof *got), *twice = calloc(total ? total : 1,
                                                                          sizeof *twice);
    if (g && ref && got && twice) {
        float loss;
        mt_mem_stats ms;
        mt_device_reset_peaks(dev);
        CHECK_OK(mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss));
        mt_device_mem_stats(dev, &ms);
        size_t shards = total * sizeof(float);
        CHECK_MSG(ms.peak[MT_MEM_PARAMS] == shards && ms.peak[MT_MEM_GRADS] == shards &&
                  ms.peak[MT_MEM_COMM] == 0, "peaks in the step: params %zu, grads %zu, comm %zu "
                  "bytes; the shards are %zu", ms.peak[MT_MEM_PARAMS], ms.peak[MT_MEM_GRADS],
                  ms.peak[MT_MEM_COMM], shards);
        shard_grads(root, got, total);
        size_t bad = count_mismatch(got, ref, total);
        CHECK_MSG(bad == 0, "%zu of %zu gradient elements differ from the unsharded model's", bad,
                  total);

        /* Without zeroing: the shard holds g, so the backward needs its own buffer. */
        mt_device_reset_peaks(dev);
        CHECK_OK(mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss));
        mt_device_mem_stats(dev, &ms);
        CHECK_MSG(ms.peak[MT_MEM_GRADS] > shards, "a backward onto non-zero shards allocated no "
                  "gradient buffer (grads peak %zu bytes)", ms.peak[MT_MEM_GRADS]);
        shard_grads(root, twice, total);
        size_t bad2 = 0;
        for (size_t i = 0; i < total; i++) {
            float want = ref[i] + ref[i];
            bad2 += memcmp(&twice[i], &want, sizeof want) != 0;
        }
        CHECK_MSG(bad2 == 0, "%zu of %zu elements after two backwards are not g + g", bad2,
                  total);

        CHECK_OK(mt_zero_grad(root));
        for (int l = 0; l <= LAYERS; l++) {
            mt_fsdp_unit *fu = mt_fsdp_unit_of(l < LAYERS ? mt_gpt_block(g, l) : root);
            CHECK_MSG(fu && fu->grad_shard_lazy && fu->grad_shard_zero, "unit %d: mt_zero_grad "
                      "did not leave its shard marked as zeros", l);
        }
        CHECK_OK(mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss));
        shard_grads(root, got, total);
        bad = count_mismatch(got, ref, total);
        CHECK_MSG(bad == 0, "after mt_zero_grad, %zu of %zu elements differ from g", bad, total);
        check_deferred_clip(dev, root, ref, total);
    }
    free(ref);
    free(got);
    free(twice);
    mt_gpt_destroy(g);
    check_protocol(mesh);
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    return check_report("test_fsdp_one_rank");
}
