/* A GPT too big for one rank's device, built deferred (models/gpt.c, module/param_init.c), through
 * mtrun on 8 ranks (dp 8) under MT_CPU_DEVICE_MEMORY (tests/models/gpt_deferred_mem.sh sets it):
 *
 *   prog_gpt_deferred_mem size        prints the whole f32 model's bytes (M), no runtime
 *   prog_gpt_deferred_mem construct   the cap must be <= M / 3: creation, sharding and
 *                                     initialisation succeed, and the device's peak is the
 *                                     shards (f32 masters and gradient shards) exactly on the
 *                                     CPU device, at most those plus one unit's shard of
 *                                     staging on a GPU
 *   prog_gpt_deferred_mem train       the cap must be <= 0.7 M: 3 training steps succeed
 *   prog_gpt_deferred_mem eager       under the construct cap, creating the model with its
 *                                     values (defer_init false) fails: the cap bites
 *
 * Eager creation would need M on every rank before the first shard exists. */
#include "check.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { LAYERS = 40, D_MODEL = 64, HEADS = 4, SEQ = 2, VOCAB = 256, BATCH = 1, STEPS = 3 };

static const mt_gpt_config CFG = {.layers = LAYERS, .d_model = D_MODEL, .heads = HEADS,
                                  .seq = SEQ, .vocab = VOCAB, .seed = 7, .defer_init = true};

/* Parameters of the model: per block 12 C^2 + 13 C, embeddings (vocab + seq) C, ln_f 2 C. */
static size_t model_params(void) {
    size_t C = D_MODEL;
    return (size_t)LAYERS * (12 * C * C + 13 * C) + (size_t)(VOCAB + SEQ) * C + 2 * C;
}

static mt_status build(mt_mesh *mesh, bool defer, mt_gpt **gpt) {
    mt_gpt_config cfg = CFG;
    cfg.defer_init = defer;
    MT_TRY(mt_gpt_create(mesh, &cfg, gpt));
    mt_fsdp_options fo = mt_fsdp_defaults(mesh, "dp");
    for (int l = 0; l < LAYERS; l++) MT_TRY(mt_fsdp_shard(mt_gpt_block(*gpt, l), &fo));
    MT_TRY(mt_fsdp_shard(mt_gpt_root(*gpt), &fo));
    return mt_module_init_params(mt_gpt_root(*gpt));
}

/* Bytes of this rank's shards (f32 master + f32 gradient), and the largest unit's shard. */
static void shard_bytes(mt_gpt *gpt, int world, size_t *total, size_t *largest) {
    *total = *largest = 0;
    for (int u = 0; u <= LAYERS; u++) {
        mt_module *m = u < LAYERS ? mt_gpt_block(gpt, u) : mt_gpt_root(gpt);
        size_t n = 0;
        for (size_t i = 0; i < mt_module_param_count(m); i++)
            n += mt_param_numel(mt_module_param(m, i));
        size_t S = (n + (size_t)world - 1) / (size_t)world * sizeof(float);
        *total += 2 * S;
        if (S > *largest) *largest = S;
    }
}

static void train(mt_gpt *gpt, int rank) {
    mt_adamw *opt = NULL;
    mt_adamw_options ao = {.lr = 1e-3f};
    CHECK_OK(mt_adamw_create(mt_gpt_root(gpt), &ao, &opt));
    int tokens[BATCH * (SEQ + 1)];
    float first = 0, loss = 0;
    for (int s = 0; s < STEPS && opt; s++) {
        for (int i = 0; i < BATCH * (SEQ + 1); i++) tokens[i] = (i * 31 + rank * 7 + s) % VOCAB;
        CHECK_OK(mt_zero_grad(mt_gpt_root(gpt)));
        CHECK_OK(mt_gpt_forward_backward(gpt, tokens, BATCH, 1.0f, &loss));
        CHECK_OK(mt_adamw_step(opt));
        if (s == 0) first = loss;
    }
    /* An initialised model starts near ln 256 = 5.545 (a model of zeros gives exactly that:
     * every logit 0), and the steps move it. */
    CHECK_MSG(first > 4.5f && first < 6.5f && fabsf(first - logf(256.0f)) > 1e-4f &&
                  first != loss, "losses %g .. %g", (double)first, (double)loss);
    mt_adamw_destroy(opt);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[argc - 1] : "";
    size_t M = model_params() * sizeof(float);
    if (strcmp(mode, "size") == 0) {
        printf("%zu\n", M);
        return 0;
    }
    mt_runtime *rt;
    if (mt_init(&rt, &argc, &argv) != MT_OK) {
        fprintf(stderr, "mt_init: %s\n", mt_last_error());
        return 1;
    }
    int world = mt_runtime_world_size(rt), rank = mt_runtime_rank(rt);
    bool eager = strcmp(mode, "eager") == 0, constructing = eager || strcmp(mode, "construct") == 0;
    mt_device *dev = mt_runtime_device(rt);
    mt_mem_stats st;
    mt_device_mem_stats(dev, &st);
    /* The cap is what makes the test: without it everything fits anyway. */
    double cap_share = constructing ? 1.0 / 3.0 : 0.7;
    CHECK_MSG(st.capacity > 0 && (double)st.capacity <= cap_share * (double)M + 1,
              "MT_CPU_DEVICE_MEMORY %zu must be set to at most %.2f of the model's %zu bytes",
              st.capacity, cap_share, M);
    mt_mesh *mesh = NULL;
    mt_gpt *gpt = NULL;
    CHECK_OK(mt_mesh_create(rt, 1, (int[]){world}, (const char *[]){"dp"}, &mesh));
    mt_device_reset_peaks(dev);
    if (eager) {
        mt_status s = build(mesh, false, &gpt);
        CHECK_MSG(s == MT_ERR_OUT_OF_MEMORY, "eager creation under the cap: %s (%s)",
                  mt_status_str(s), mt_last_error());
        mt_gpt_destroy(gpt);
        gpt = NULL;
    } else {
        CHECK_OK(build(mesh, true, &gpt));
        CHECK(gpt && mt_gpt_param_count(gpt) == model_params());
    }
    if (gpt && constructing) {
        size_t shards, largest;
        shard_bytes(gpt, world, &shards, &largest);
        mt_device_mem_stats(dev, &st);
        /* On the CPU device the initialisers write into the shards in place: the peak is the
         * shards, to the byte. A GPU initialises through a bounded host staging buffer, and
         * may hold one unit's shard of device staging besides. */
        if (mt_device_get_kind(dev) == MT_DEVICE_CPU)
            CHECK_MSG(st.total_peak == shards, "construction peak %zu bytes on the CPU device, "
                      "shards %zu", st.total_peak, shards);
        else
            CHECK_MSG(st.total_peak <= shards + largest, "construction peak %zu bytes, shards "
                      "%zu + one unit's staging %zu", st.total_peak, shards, largest);
        if (rank == 0)
            printf("construct: model %zu bytes, cap %zu, peak %zu (shards %zu, largest unit "
                   "shard %zu)\n", M, st.capacity, st.total_peak, shards, largest);
    } else if (gpt) {
        train(gpt, rank);
        mt_device_mem_stats(dev, &st);
        if (rank == 0)
            printf("train: model %zu bytes, cap %zu, peak %zu\n", M, st.capacity, st.total_peak);
    }
    mt_gpt_destroy(gpt);
    mt_mesh_destroy(mesh);
    char name[64];
    snprintf(name, sizeof name, "prog_gpt_deferred_mem %s rank %d", mode, rank);
    int rc = check_report(name);
    mt_finalize(rt);
    return rc;
}
