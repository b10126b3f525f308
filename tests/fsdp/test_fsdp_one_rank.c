/* FSDP at one rank (fsdp_unit.c mt_fsdp_gather_aliases, fsdp_schedule.c mt_fsdp_grads_alias):
 * the shard is the whole flat buffer, so the engine neither gathers into a second buffer nor
 * reduces through one. Checked on a small GPT, no launcher:
 *   - the gradient shards after one step equal, bit for bit, the gradients the same GPT computes
 *     unsharded (its module functions with no FSDP hook, gradients in plain buffers);
 *   - no full parameter or gradient buffer exists during that step: the params and grads peaks
 *     are the shards' bytes, comm stays 0;
 *   - a second backward without mt_zero_grad (the shard holds g, not zeros) goes through a
 *     separate buffer as before: the shard becomes g + g exactly, not the sum re-associated;
 *   - after mt_zero_grad the step adds in place again and gives g once more.
 */
#include "check.h"
#include "fsdp/fsdp_internal.h"
#include "fsdp/fsdp_shards.h"
#include "module/module_internal.h"

#include <meshtrain/meshtrain.h>

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

static size_t count_mismatch(const float *a, const float *b, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&a[i], &b[i], sizeof *a) != 0;
    return bad;
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
        CHECK_OK(mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss));
        shard_grads(root, got, total);
        bad = count_mismatch(got, ref, total);
        CHECK_MSG(bad == 0, "after mt_zero_grad, %zu of %zu elements differ from g", bad, total);
    }
    free(ref);
    free(got);
    free(twice);
    mt_gpt_destroy(g);
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    return check_report("test_fsdp_one_rank");
}
