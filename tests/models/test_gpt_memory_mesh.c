/* mt_gpt_memory_predict against the device's accounting for what train_gpt has no option for:
 * HSDP (a replicate dimension) and the reshard_after_forward policies, with bf16, accumulation
 * and prefetch switches. Run through mtrun on rep x dp x tp ranks (gpt.cmake):
 *
 *   test_gpt_memory_mesh REP DP TP RESHARD PARAM_DTYPE REDUCE_DTYPE ACCUM PREFETCH
 *
 * Each rank builds the GPT on a {"rep", "dp", "tp"} mesh, shards each block and the root over
 * "dp" (replicated over "rep" when REP > 1), trains 3 steps as train_gpt does (micro-batches
 * with gradient sync on the last, clipping, AdamW, zero_grad), resetting the peaks at each
 * step's start, and checks that its highest peaks per category, of the total, and before step 0
 * equal the prediction to the byte (the vocabulary is divisible by tp, so every rank holds the
 * sizes the prediction describes). */
#include "check.h"

#include <meshtrain/meshtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const mt_gpt_config CFG = {.layers = 3, .d_model = 64, .heads = 4, .seq = 32,
                                  .vocab = 256, .seed = 5};
enum { BATCH = 2, STEPS = 3 };

static int parse_plan(char **argv, mt_gpt_memory_plan *plan) {
    *plan = mt_gpt_memory_plan_defaults();
    plan->replicate = atoi(argv[1]);
    plan->dp = atoi(argv[2]);
    plan->tp = atoi(argv[3]);
    plan->reshard_after_forward = atoi(argv[4]);
    if (mt_dtype_parse(argv[5], &plan->param_dtype) != MT_OK ||
        mt_dtype_parse(argv[6], &plan->reduce_dtype) != MT_OK)
        return -1;
    plan->grad_accum = atoi(argv[7]);
    plan->prefetch = atoi(argv[8]) != 0;
    plan->batch = BATCH;
    return 0;
}

static mt_status build(mt_mesh *mesh, const mt_gpt_memory_plan *plan, mt_gpt **gpt,
                       mt_adamw **adam) {
    MT_TRY(mt_gpt_create(mesh, &CFG, gpt));
    mt_fsdp_options fo = mt_fsdp_defaults(mesh, "dp");
    fo.replicate_dim = plan->replicate > 1 ? "rep" : NULL;
    fo.reshard_after_forward = plan->reshard_after_forward;
    fo.param_dtype = plan->param_dtype;
    fo.reduce_dtype = plan->reduce_dtype;
    for (int l = 0; l < CFG.layers; l++) MT_TRY(mt_fsdp_shard(mt_gpt_block(*gpt, l), &fo));
    mt_module *root = mt_gpt_root(*gpt);
    MT_TRY(mt_fsdp_shard(root, &fo));
    if (!plan->prefetch) MT_TRY(mt_fsdp_set_prefetch(root, false));
    mt_adamw_options ao = {.lr = 1e-3f};
    return mt_adamw_create(root, &ao, adam);
}

/* One step as train_gpt's train_step; the step's peaks raise *highest. */
static mt_status step(mt_device *dev, mt_gpt *gpt, mt_adamw *adam, const mt_gpt_memory_plan *plan,
                      int *tokens, int s, mt_mem_stats *highest) {
    mt_module *root = mt_gpt_root(gpt);
    mt_device_reset_peaks(dev);
    for (int m = 0; m < plan->grad_accum; m++) {
        if (plan->grad_accum > 1)
            MT_TRY(mt_fsdp_set_requires_gradient_sync(root, m == plan->grad_accum - 1));
        for (int i = 0; i < BATCH * (CFG.seq + 1); i++)
            tokens[i] = (i * 31 + s * 7 + m * 13) % CFG.vocab;
        float loss;
        MT_TRY(mt_gpt_forward_backward(gpt, tokens, BATCH, 1.0f / (float)plan->grad_accum, &loss));
    }
    float norm;
    MT_TRY(mt_clip_grad_norm(root, 1.0f, &norm));
    MT_TRY(mt_adamw_step(adam));
    MT_TRY(mt_zero_grad(root));
    mt_mem_stats st;
    mt_device_mem_stats(dev, &st);
    for (int c = 0; c < MT_MEM_CATEGORY_COUNT; c++)
        if (st.peak[c] > highest->peak[c]) highest->peak[c] = st.peak[c];
    if (st.total_peak > highest->total_peak) highest->total_peak = st.total_peak;
    return MT_OK;
}

static int run(mt_runtime *rt, const mt_gpt_memory_plan *plan) {
    mt_gpt_memory_prediction p;
    CHECK_OK(mt_gpt_memory_predict(&CFG, plan, &p));
    mt_mesh *mesh = NULL;
    mt_gpt *gpt = NULL;
    mt_adamw *adam = NULL;
    int *tokens = malloc(sizeof(int) * BATCH * (CFG.seq + 1));
    mt_device *dev = mt_runtime_device(rt);
    mt_mem_stats setup, highest;
    memset(&highest, 0, sizeof highest);
    mt_status st = tokens ? MT_OK : MT_ERR_OUT_OF_MEMORY;
    if (st == MT_OK)
        st = mt_mesh_create(rt, 3, (int[]){plan->replicate, plan->dp, plan->tp},
                            (const char *[]){"rep", "dp", "tp"}, &mesh);
    if (st == MT_OK) st = build(mesh, plan, &gpt, &adam);
    mt_device_mem_stats(dev, &setup);
    for (int s = 0; s < STEPS && st == MT_OK; s++)
        st = step(dev, gpt, adam, plan, tokens, s, &highest);
    CHECK_MSG(st == MT_OK, "%s", mt_last_error());
    if (st == MT_OK) {
        int rank = mt_runtime_rank(rt);
        for (int c = 0; c < MT_MEM_CATEGORY_COUNT; c++)
            CHECK_MSG(highest.peak[c] == p.peak[c], "rank %d: %s measured %zu, predicted %zu",
                      rank, mt_mem_category_name((mt_mem_category)c), highest.peak[c], p.peak[c]);
        CHECK_MSG(highest.total_peak == p.total_peak, "rank %d: total measured %zu, predicted "
                  "%zu (%s)", rank, highest.total_peak, p.total_peak, p.total_peak_at);
        CHECK_MSG(setup.total_peak == p.setup_peak, "rank %d: setup measured %zu, predicted %zu",
                  rank, setup.total_peak, p.setup_peak);
    }
    mt_adamw_destroy(adam);
    mt_gpt_destroy(gpt);
    mt_mesh_destroy(mesh);
    free(tokens);
    return 0;
}

int main(int argc, char **argv) {
    mt_runtime *rt = NULL;
    mt_gpt_memory_plan plan;
    if (argc != 9 || parse_plan(argv, &plan) != 0) {
        fprintf(stderr, "usage: test_gpt_memory_mesh REP DP TP RESHARD PARAM_DTYPE REDUCE_DTYPE "
                        "ACCUM PREFETCH\n");
        return 2;
    }
    if (mt_init(&rt, &argc, &argv) != MT_OK) {
        fprintf(stderr, "test_gpt_memory_mesh: %s\n", mt_last_error());
        return 1;
    }
    plan.cpu_device = mt_device_get_kind(mt_runtime_device(rt)) == MT_DEVICE_CPU;
    run(rt, &plan);
    mt_finalize(rt);
    return check_report("test_gpt_memory_mesh");
}
