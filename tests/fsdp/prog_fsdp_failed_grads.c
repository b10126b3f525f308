/* FSDP's gradient shards after a backward that failed part-way (fsdp_schedule.c: the dropped
 * gradient buffer, drop_grad_buffer, and a reduce-scatter into the shard that failed,
 * rs_in_shard_undo), on a small GPT under mtrun with 1 or 2 ranks, against a clean model's
 * gradients of the same step (bit for bit):
 *
 *   failed backward (any rank count): a test hook on block 0, registered inside FSDP's, fails its
 *   post-backward after the block's backward wrote its gradient (at one rank straight into the
 *   shard, mt_fsdp_grads_alias; the hook checks that it did). Then block 0 and the root (whose
 *   backward fails with it, part-way: at one rank its shard already holds the head's gradient)
 *   hold zeros again with grad_shard_zero set, block 1 (finished before the failure) holds the
 *   clean step's gradient, and no gradient buffer is left. The next step without mt_zero_grad
 *   gives the clean step's bits in block 0 and the root and twice them in block 1 (g + g, through
 *   its own buffer); after mt_zero_grad a step gives the clean step's bits everywhere.
 *
 *   failed reduce-scatter (2+ ranks): the same hook turns the collectives' launch failure on
 *   (MT_TEST_COLL_LAUNCH_FAIL's switch, comm/work.c) on every rank, so the reduce-scatter that
 *   FSDP's post-backward then issues into block 0's zeroed shard (mt_fsdp_rs_into_shard) fails
 *   on every rank. Block 0's shard is zeros again with grad_shard_zero set and nothing staged, no
 *   comm or gradient buffer is left, and the model refuses its next step with the first failure
 *   (the documented rule: after a failed collective its ranks are out of step) without touching
 *   the shards. A fresh model on the same ranks then gives the clean step's bits: the failed
 *   launch moved nothing, so the ranks' collectives are still in step.
 *
 * Exits 0 when every check passed on this rank.
 */
#include "check.h"
#include "comm/work.h"
#include "core/error.h"
#include "fsdp/fsdp_internal.h"

#include <meshtrain/meshtrain.h>

#include <stdlib.h>
#include <string.h>

#define LAYERS 2
#define BATCH 2
#define SEQ 8
#define NU (LAYERS + 1) /* the blocks, then the root */

static const mt_gpt_config cfg = {.layers = LAYERS, .d_model = 32, .heads = 4, .seq = SEQ,
                                  .vocab = 40, .seed = 11};

enum { FAIL_NONE, FAIL_BACKWARD, FAIL_LAUNCH };

/* The test hook's registration on block 0 (inside FSDP's: its post-backward runs first). */
typedef struct hook_state {
    int mode;            /* FAIL_* for the next backward */
    mt_fsdp_unit *root;  /* the model's root unit */
    bool saw_aliased;    /* at one rank: the block's gradient was in its shard when it failed */
    bool saw_root_part;  /* and the root's shard held part of its gradient (the head's) */
} hook_state;

static const char hook_owner = 0;

static mt_fsdp_unit *unit(mt_gpt *g, int u) {
    return mt_fsdp_unit_of(u < LAYERS ? mt_gpt_block(g, u) : mt_gpt_root(g));
}

static bool any_nonzero(const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != 0.0f) return true;
    return false;
}

static mt_status fail_post_backward(mt_module *m, void *user, mt_status st) {
    hook_state *h = user;
    if (st != MT_OK || h->mode == FAIL_NONE) return st;
    if (h->mode == FAIL_LAUNCH) {
        mt_work_inject_launch_failure(true); /* off again once the backward returned */
        return MT_OK;
    }
    mt_fsdp_unit *u = mt_fsdp_unit_of(m);
    h->saw_aliased = u && u->grad_aliased && any_nonzero(u->grad_shard, u->S);
    h->saw_root_part = h->root->grad_aliased && any_nonzero(h->root->grad_shard, h->root->S);
    return mt_error(MT_ERR_INVALID_ARG, "the backward of '%s' fails on purpose (test hook)",
                    mt_module_name(m));
}

static const mt_module_hooks fail_hooks = {.post_backward = fail_post_backward};

static mt_gpt *build(mt_mesh *mesh) {
    mt_gpt *g = NULL;
    CHECK_OK(mt_gpt_create(mesh, &cfg, &g));
    if (!g) return NULL;
    mt_fsdp_options fo = mt_fsdp_defaults(mesh, "dp");
    for (int l = 0; l < LAYERS; l++) CHECK_OK(mt_fsdp_shard(mt_gpt_block(g, l), &fo));
    CHECK_OK(mt_fsdp_shard(mt_gpt_root(g), &fo));
    for (int u = 0; u < NU; u++)
        if (!unit(g, u)) {
            CHECK_MSG(false, "unit %d of the GPT is not an FSDP unit", u);
            mt_gpt_destroy(g);
            return NULL;
        }
    return g;
}

/* Each unit's gradient shard, copied (S elements each). */
typedef struct grads {
    float *u[NU];
    size_t n[NU];
} grads;

/* Unit u's gradient shard as a reader sees it: a shard mt_zero_grad marked instead of zeroing
 * (grad_shard_lazy) gets its zeros first, as the optimizer's and clipping's views do. */
static const float *shard_grad(mt_gpt *g, int u) {
    mt_fsdp_unit *fu = unit(g, u);
    CHECK_MSG(mt_fsdp_grad_shard_ready(fu) == MT_OK, "zeroing %d's lazy gradient shard: %s", u,
              mt_last_error());
    return fu->grad_shard;
}

static bool grads_take(mt_gpt *g, grads *out) {
    bool ok = true;
    for (int u = 0; u < NU; u++) {
        mt_fsdp_unit *fu = unit(g, u);
        out->n[u] = fu->S;
        out->u[u] = malloc((fu->S ? fu->S : 1) * sizeof(float));
        if (out->u[u]) memcpy(out->u[u], shard_grad(g, u), fu->S * sizeof(float));
        else ok = false;
    }
    return ok;
}

static void grads_free(grads *gr) {
    for (int u = 0; u < NU; u++) free(gr->u[u]);
}

/* Counts the elements of unit u's shard whose bits differ from ref times `times` (1 or 2:
 * ref + ref, the sum the accumulation computes). */
static size_t differ(mt_gpt *g, const grads *ref, int u, int times) {
    mt_fsdp_unit *fu = unit(g, u);
    const float *have = shard_grad(g, u);
    size_t bad = 0;
    for (size_t i = 0; i < fu->S; i++) {
        float want = times == 2 ? ref->u[u][i] + ref->u[u][i] : ref->u[u][i];
        bad += memcmp(&have[i], &want, sizeof want) != 0;
    }
    return bad;
}

static size_t nonzero(mt_gpt *g, int u) {
    mt_fsdp_unit *fu = unit(g, u);
    const float *have = shard_grad(g, u);
    size_t n = 0;
    for (size_t i = 0; i < fu->S; i++) n += have[i] != 0.0f;
    return n;
}

static size_t current(mt_device *dev, mt_mem_category k) {
    mt_mem_stats ms;
    mt_device_mem_stats(dev, &ms);
    return ms.current[k];
}

static const char *unit_label(int u) { return u == 0 ? "block 0" : u == 1 ? "block 1" : "root"; }

/* After the failed pass: the units whose backward failed (block 0, the root) hold zeros and may
 * be added into again, and hold no full gradient or staging; block 1, finished before the
 * failure, holds the clean step's gradient. */
static void check_after_failure(mt_gpt *g, const grads *ref, const char *what) {
    for (int u = 0; u < NU; u++) {
        mt_fsdp_unit *fu = unit(g, u);
        if (u == 1) {
            size_t bad = differ(g, ref, u, 1);
            CHECK_MSG(bad == 0, "%s: %zu of %zu elements of block 1's gradient differ from the "
                      "clean step's", what, bad, fu->S);
            continue;
        }
        size_t nz = nonzero(g, u);
        CHECK_MSG(nz == 0, "%s: %zu of %zu elements of %s's gradient shard are not zero", what,
                  nz, fu->S, unit_label(u));
        CHECK_MSG(fu->grad_shard_zero, "%s: %s's grad_shard_zero is false", what, unit_label(u));
        CHECK_MSG(!fu->full_grad && !fu->grad_aliased && !fu->rs_in_shard && !fu->rs_recv &&
                  !fu->rs_send && !fu->rs_work, "%s: %s still holds a gradient or reduce-scatter "
                  "buffer", what, unit_label(u));
    }
}

static void check_clean(mt_gpt *g, const grads *ref, const char *what) {
    for (int u = 0; u < NU; u++) {
        size_t bad = differ(g, ref, u, 1);
        CHECK_MSG(bad == 0, "%s: %zu of %zu elements of %s's gradient differ from the clean "
                  "step's", what, bad, unit(g, u)->S, unit_label(u));
    }
}

static void failed_backward(mt_mesh *mesh, mt_device *dev, const int *tokens, const grads *ref,
                            int world) {
    mt_gpt *g = build(mesh);
    if (!g) return;
    hook_state h = {.root = unit(g, LAYERS)};
    CHECK_OK(mt_module_add_hooks(mt_gpt_block(g, 0), &hook_owner, &fail_hooks, &h));
    size_t base = current(dev, MT_MEM_GRADS);
    float loss;
    /* Twice: the first pass records the order, the second prefetches along it. */
    for (int pass = 0; pass < 2; pass++) {
        h.mode = FAIL_BACKWARD;
        mt_status st = mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss);
        h.mode = FAIL_NONE;
        CHECK_MSG(st == MT_ERR_INVALID_ARG && strstr(mt_last_error(), "fails on purpose"),
                  "failed backward %d: %s: %s", pass, mt_status_str(st), mt_last_error());
        if (world == 1) {
            CHECK_MSG(h.saw_aliased, "failed backward %d: block 0's gradient was not in its "
                      "shard when its backward failed (the one-rank alias did not happen)", pass);
            CHECK_MSG(h.saw_root_part, "failed backward %d: the root's shard held none of its "
                      "gradient when block 0 failed: the root's part-way case is not tested",
                      pass);
        }
        check_after_failure(g, ref, "after a failed backward");
        CHECK_MSG(current(dev, MT_MEM_GRADS) == base, "after a failed backward the grads "
                  "category holds %zu bytes, the shards %zu", current(dev, MT_MEM_GRADS), base);

        CHECK_OK(mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss));
        for (int u = 0; u < NU; u++) {
            int times = u == 1 ? 2 : 1;
            size_t bad = differ(g, ref, u, times);
            CHECK_MSG(bad == 0, "the step after a failed backward: %zu of %zu elements of %s's "
                      "gradient are not %s", bad, unit(g, u)->S, unit_label(u),
                      times == 2 ? "g + g" : "the clean step's g");
        }
        CHECK_OK(mt_zero_grad(mt_gpt_root(g)));
        CHECK_OK(mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss));
        check_clean(g, ref, "after a failed backward and mt_zero_grad");
        CHECK_OK(mt_zero_grad(mt_gpt_root(g)));
    }
    mt_gpt_destroy(g);
}

static void failed_reduce_scatter(mt_mesh *mesh, mt_device *dev, const int *tokens,
                                  const grads *ref) {
    mt_gpt *g = build(mesh);
    if (!g) return;
    hook_state h = {.root = unit(g, LAYERS)};
    CHECK_OK(mt_module_add_hooks(mt_gpt_block(g, 0), &hook_owner, &fail_hooks, &h));
    size_t base_g = current(dev, MT_MEM_GRADS), base_c = current(dev, MT_MEM_COMM);
    CHECK_MSG(mt_fsdp_rs_into_shard(unit(g, 0)), "block 0's reduce-scatter would not write "
              "into its shard: this case tests nothing");
    float loss;
    h.mode = FAIL_LAUNCH;
    mt_status st = mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss);
    mt_work_inject_launch_failure(false);
    h.mode = FAIL_NONE;
    char first[1024];
    snprintf(first, sizeof first, "%s", mt_last_error());
    CHECK_MSG(st == MT_ERR_COMM && strstr(first, "reduce-scatter of the gradients of") &&
              strstr(first, "MT_TEST_COLL_LAUNCH_FAIL"), "failed reduce-scatter: %s: %s",
              mt_status_str(st), first);
    check_after_failure(g, ref, "after a failed reduce-scatter into the shard");
    /* issue_rs frees the unit's full gradient with the staging: nothing will reduce it. */
    CHECK_MSG(current(dev, MT_MEM_GRADS) == base_g && current(dev, MT_MEM_COMM) == base_c &&
              !unit(g, 0)->full_grad, "after a failed reduce-scatter: grads %zu bytes (shards "
              "%zu), comm %zu (before %zu), block 0's full gradient %s",
              current(dev, MT_MEM_GRADS), base_g, current(dev, MT_MEM_COMM), base_c,
              unit(g, 0)->full_grad ? "still held" : "freed");

    st = mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss);
    CHECK_MSG(st == MT_ERR_COMM && strstr(mt_last_error(), "an earlier collective of this "
              "model failed") && strstr(mt_last_error(), "MT_TEST_COLL_LAUNCH_FAIL"),
              "the step after a failed reduce-scatter: %s: %s", mt_status_str(st),
              mt_last_error());
    check_after_failure(g, ref, "after the refused step");
    mt_gpt_destroy(g);

    g = build(mesh);
    if (!g) return;
    CHECK_OK(mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss));
    check_clean(g, ref, "a fresh model after the failed reduce-scatter");
    mt_gpt_destroy(g);
}

int main(int argc, char **argv) {
    mt_runtime *rt = NULL;
    CHECK_OK(mt_init(&rt, &argc, &argv));
    if (!rt) return check_report("prog_fsdp_failed_grads");
    int world = mt_runtime_world_size(rt), rank = mt_runtime_rank(rt);
    mt_device *dev = mt_runtime_device(rt);
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 2, (int[]){world, 1}, (const char *[]){"dp", "tp"}, &mesh));
    int tokens[BATCH * (SEQ + 1)]; /* BATCH sequences of seq + 1 tokens, per rank */
    for (int i = 0; i < BATCH * (SEQ + 1); i++) tokens[i] = (i * 7 + 3 + 5 * rank) % cfg.vocab;

    grads ref = {0};
    mt_gpt *clean = mesh ? build(mesh) : NULL;
    if (clean) {
        float loss;
        CHECK_OK(mt_gpt_forward_backward(clean, tokens, BATCH, 1.0f, &loss));
        CHECK(grads_take(clean, &ref));
        for (int u = 0; u < NU; u++)
            CHECK_MSG(nonzero(clean, u) > 0, "the clean step left %s's gradient zero: the "
                      "checks below could not tell a dropped gradient from a kept one",
                      unit_label(u));
        mt_gpt_destroy(clean);
        failed_backward(mesh, dev, tokens, &ref, world);
        if (world > 1) failed_reduce_scatter(mesh, dev, tokens, &ref);
        else printf("one rank: no reduce-scatter to fail, that case needs 2 ranks\n");
    }
    grads_free(&ref);
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    return check_report("prog_fsdp_failed_grads");
}
