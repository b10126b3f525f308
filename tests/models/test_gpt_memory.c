/* mt_gpt_memory_predict (models/gpt_memory.c) without running anything: its argument checks, and
 * the activation checkpointing, sequence parallelism and offload terms against what their designs say
 * they save (the code itself is compared with the device's accounting by
 * tests/examples/train_gpt_memory.sh). */
#include "check.h"

#include <meshtrain/gpt.h>
#include <meshtrain/meshtrain.h>

#include <stdio.h>

#include <string.h>

static const mt_gpt_config cfg = {.layers = 3, .d_model = 64, .heads = 4, .seq = 32,
                                  .vocab = 64, .seed = 1};

static mt_gpt_memory_prediction predict(const mt_gpt_memory_plan *plan) {
    mt_gpt_memory_prediction p;
    memset(&p, 0, sizeof p);
    CHECK_OK(mt_gpt_memory_predict(&cfg, plan, &p));
    return p;
}

/* Bytes of the 12 activations of one block a checkpointed block discards after its forward
 * (all of block_acts but its output), f32, tp 1: ln1, qkv, atty, res_mid, ln2, fc, fc_gelu are
 * 1 + 3 + 1 + 1 + 1 + 4 + 4 = 15 N x C, four N-row statistics, the attention probabilities. */
static size_t discarded_bytes(int batch) {
    size_t N = (size_t)batch * cfg.seq, C = cfg.d_model;
    size_t att = (size_t)batch * cfg.heads * cfg.seq * cfg.seq;
    return (15 * N * C + 4 * N + att) * sizeof(float);
}

static void test_errors(void) {
    mt_gpt_memory_plan plan = mt_gpt_memory_plan_defaults();
    mt_gpt_memory_prediction p;
    CHECK(mt_gpt_memory_predict(NULL, &plan, &p) == MT_ERR_INVALID_ARG);
    plan.tp = 3;
    CHECK(mt_gpt_memory_predict(&cfg, &plan, &p) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "heads 4 not divisible by tp 3") != NULL, "%s",
              mt_last_error());
    plan = mt_gpt_memory_plan_defaults();
    plan.batch = 0;
    CHECK(mt_gpt_memory_predict(&cfg, &plan, &p) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "batch 0") != NULL, "%s", mt_last_error());
    plan = mt_gpt_memory_plan_defaults();
    plan.activation_checkpointing = MT_GPT_AC_EVERY;
    plan.ac_every = 0;
    CHECK(mt_gpt_memory_predict(&cfg, &plan, &p) == MT_ERR_INVALID_ARG);
    plan = mt_gpt_memory_plan_defaults();
    plan.tp = 4;
    plan.batch = 1;
    plan.sequence_parallel = MT_GPT_SP_REGATHER;
    mt_gpt_config odd = cfg;
    odd.seq = 30; /* 30 rows do not split over tp 4 */
    CHECK(mt_gpt_memory_predict(&odd, &plan, &p) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "tp 4") != NULL, "%s", mt_last_error());
    plan = mt_gpt_memory_plan_defaults();
    plan.sequence_parallel = MT_GPT_SP_KEEP_GATHERED + 1;
    CHECK(mt_gpt_memory_predict(&cfg, &plan, &p) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "sequence_parallel 3 is no mode") != NULL, "%s",
              mt_last_error());
    mt_clear_error();
}

/* The predictor refuses what the model refuses, with the model's message: sequence parallelism
 * splits each sequence (seq % tp, mt_tp_sequence_check), not the batch's rows, and the model's
 * 32-bit size limits hold. */
static void test_model_refusals(void) {
    mt_gpt_memory_plan plan = mt_gpt_memory_plan_defaults();
    mt_gpt_memory_prediction p;
    plan.tp = 4;
    plan.batch = 2; /* 2 x 6 = 12 rows divide over tp 4, seq 6 does not */
    mt_gpt_config six = cfg;
    six.seq = 6;
    for (int mode = MT_GPT_SP_REGATHER; mode <= MT_GPT_SP_KEEP_GATHERED; mode++) {
        plan.sequence_parallel = mode;
        CHECK(mt_gpt_memory_predict(&six, &plan, &p) == MT_ERR_INVALID_ARG);
        CHECK_MSG(strstr(mt_last_error(), "mt_gpt_memory_predict") &&
                      strstr(mt_last_error(), "sequence parallelism: seq 6 not divisible by tp 4"),
                  "%s", mt_last_error());
    }
    plan.sequence_parallel = MT_GPT_SP_OFF; /* without SP the split is the heads' */
    CHECK_OK(mt_gpt_memory_predict(&six, &plan, &p));

    /* 3000 x 256 x 256 > INT32_MAX / 16: the model's message, word for word. */
    mt_gpt_config big = {.layers = 3000, .d_model = 256, .heads = 8, .seq = 64, .vocab = 256,
                         .seed = 1, .defer_init = true};
    mt_runtime *rt = NULL;
    mt_mesh *mesh = NULL;
    mt_gpt *g = NULL;
    CHECK_OK(mt_init(&rt, NULL, NULL));
    CHECK_OK(mt_mesh_create(rt, 1, (int[]){1}, (const char *[]){"dp"}, &mesh));
    CHECK(mt_gpt_create(mesh, &big, &g) == MT_ERR_INVALID_ARG);
    CHECK(g == NULL);
    char model_msg[1024];
    snprintf(model_msg, sizeof model_msg, "%s", mt_last_error());
    CHECK_MSG(strstr(model_msg, "32-bit sizes"), "%s", model_msg);
    plan = mt_gpt_memory_plan_defaults();
    CHECK(mt_gpt_memory_predict(&big, &plan, &p) == MT_ERR_INVALID_ARG);
    /* Both carry the rank prefix once, at the front: compare what follows it. */
    const char *model_says = strstr(model_msg, "gpt: ");
    CHECK_MSG(model_says && strstr(mt_last_error(), model_says), "predict: %s; model: %s",
              mt_last_error(), model_msg);
    big.layers = 2; /* the same shape, small enough: both accept it */
    CHECK_OK(mt_gpt_memory_predict(&big, &plan, &p));
    CHECK_OK(mt_gpt_create(mesh, &big, &g));
    mt_gpt_destroy(g);
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    mt_clear_error();
}

/* Activations peak in the backward of the last block, where every block's are held:
 * checkpointing all blocks saves the discarded activations of the other L - 1 there (the last
 * recomputes its own), checkpointing every L-th (block 0 only) saves block 0's, every 1 is full.
 * The total may then peak elsewhere (a block later, where gradient buffers pile up). */
static void test_activation_checkpointing(void) {
    mt_gpt_memory_plan plan = mt_gpt_memory_plan_defaults();
    plan.batch = 4;
    mt_gpt_memory_prediction none = predict(&plan);
    plan.activation_checkpointing = MT_GPT_AC_FULL;
    mt_gpt_memory_prediction full = predict(&plan);
    plan.activation_checkpointing = MT_GPT_AC_EVERY;
    plan.ac_every = 1;
    mt_gpt_memory_prediction every1 = predict(&plan);
    plan.ac_every = cfg.layers;
    mt_gpt_memory_prediction everyL = predict(&plan);
    const int A = MT_MEM_ACTIVATIONS;
    size_t d = discarded_bytes(plan.batch);
    CHECK_MSG(none.peak[A] - full.peak[A] == (size_t)(cfg.layers - 1) * d,
              "none %zu, full %zu, discarded per block %zu", none.peak[A], full.peak[A], d);
    CHECK_MSG(none.peak[A] - everyL.peak[A] == d, "none %zu, every %d %zu", none.peak[A],
              cfg.layers, everyL.peak[A]);
    CHECK(full.total_peak < none.total_peak);
    CHECK(every1.total_peak == full.total_peak);
    CHECK(!memcmp(every1.peak, full.peak, sizeof full.peak));
    for (int c = MT_MEM_PARAMS; c <= MT_MEM_OPTIMIZER; c++)
        CHECK(full.peak[c] == none.peak[c] && everyL.peak[c] == none.peak[c]);
    CHECK(full.setup_peak == none.setup_peak);
}

/* What a checkpointed block discards with sequence parallelism over tp: the rows outside
 * attention and MLP are R = N / tp (ln1, res_mid, ln2: 3 R x C, four R-row statistics), the
 * others tp-local (qkv, atty, fc, fc_gelu: 12 N x C / tp, the attention probabilities / tp);
 * keeping the column-parallel inputs gathered holds ln1 and ln2 gathered, N x C each, instead
 * of their R rows. */
static size_t discarded_sp_bytes(int batch, int tp, bool keep) {
    size_t N = (size_t)batch * cfg.seq, C = cfg.d_model, R = N / (size_t)tp;
    size_t att = (size_t)batch * cfg.heads * cfg.seq * cfg.seq / (size_t)tp;
    size_t ln = keep ? 2 * N * C : 2 * R * C;
    return (ln + R * C + 4 * R + 12 * N * C / (size_t)tp + att) * sizeof(float);
}

/* Recompute under both sequence-parallel modes: as without it, the peak in the last block's
 * backward loses the other L - 1 blocks' discarded activations, the gathered inputs a
 * keep-gathered block holds among them (its discard frees them, its re-run makes them again). */
static void test_sequence_parallel_recompute(void) {
    const int modes[2] = {MT_GPT_SP_REGATHER, MT_GPT_SP_KEEP_GATHERED};
    for (int i = 0; i < 2; i++) {
        mt_gpt_memory_plan plan = mt_gpt_memory_plan_defaults();
        plan.batch = 4;
        plan.tp = 2;
        plan.sequence_parallel = modes[i];
        mt_gpt_memory_prediction none = predict(&plan);
        plan.activation_checkpointing = MT_GPT_AC_FULL;
        mt_gpt_memory_prediction full = predict(&plan);
        const int A = MT_MEM_ACTIVATIONS;
        size_t d = discarded_sp_bytes(plan.batch, plan.tp, modes[i] == MT_GPT_SP_KEEP_GATHERED);
        CHECK_MSG(none.peak[A] - full.peak[A] == (size_t)(cfg.layers - 1) * d,
                  "mode %d: none %zu, full %zu, discarded per block %zu", modes[i], none.peak[A],
                  full.peak[A], d);
    }
}

/* Sequence parallelism shards rows outside attention and MLP over tp: less activation memory,
 * the same parameters, gradients and optimizer state; at tp 1 there is nothing to shard.
 * Keeping the column-parallel inputs gathered holds more activations than gathering them
 * again, fewer than without sequence parallelism (the LayerNorm outputs are whole again, the
 * residual stream stays split). */
static void test_sequence_parallel(void) {
    mt_gpt_memory_plan plan = mt_gpt_memory_plan_defaults();
    plan.tp = 2;
    mt_gpt_memory_prediction off = predict(&plan);
    plan.sequence_parallel = true;
    mt_gpt_memory_prediction on = predict(&plan);
    CHECK_MSG(on.peak[MT_MEM_ACTIVATIONS] < off.peak[MT_MEM_ACTIVATIONS], "SP %zu, without %zu",
              on.peak[MT_MEM_ACTIVATIONS], off.peak[MT_MEM_ACTIVATIONS]);
    for (int c = MT_MEM_PARAMS; c <= MT_MEM_OPTIMIZER; c++) CHECK(on.peak[c] == off.peak[c]);
    plan.sequence_parallel = MT_GPT_SP_KEEP_GATHERED;
    mt_gpt_memory_prediction keep = predict(&plan);
    CHECK_MSG(keep.peak[MT_MEM_ACTIVATIONS] > on.peak[MT_MEM_ACTIVATIONS] &&
                  keep.peak[MT_MEM_ACTIVATIONS] < off.peak[MT_MEM_ACTIVATIONS],
              "kept gathered %zu, re-gathered %zu, without %zu", keep.peak[MT_MEM_ACTIVATIONS],
              on.peak[MT_MEM_ACTIVATIONS], off.peak[MT_MEM_ACTIVATIONS]);
    for (int c = MT_MEM_PARAMS; c <= MT_MEM_OPTIMIZER; c++) CHECK(keep.peak[c] == off.peak[c]);
    plan.tp = 1;
    mt_gpt_memory_prediction keep1 = predict(&plan);
    plan.sequence_parallel = MT_GPT_SP_REGATHER;
    mt_gpt_memory_prediction sp1 = predict(&plan);
    plan.sequence_parallel = false;
    mt_gpt_memory_prediction plain1 = predict(&plan);
    CHECK(sp1.total_peak == plain1.total_peak);
    CHECK(!memcmp(sp1.peak, plain1.peak, sizeof sp1.peak));
    CHECK(!memcmp(keep1.peak, plain1.peak, sizeof keep1.peak));
}

/* Offload: what moves to the host tier and what stays. cfg's largest unit is a block (6C + 12C^2
 * + 7C elements at tp 1: 49984), so the landing block is one block's f32 shard at dp 1. */
static void test_offload(void) {
    mt_gpt_memory_plan plan = mt_gpt_memory_plan_defaults();
    mt_gpt_memory_prediction p;
    plan.offload = MT_OFFLOAD_FULL;
    plan.offload_ratio = 1.5f;
    CHECK(mt_gpt_memory_predict(&cfg, &plan, &p) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "ratio 1.5") != NULL, "%s", mt_last_error());
    plan.offload = 7;
    plan.offload_ratio = 1.0f;
    CHECK(mt_gpt_memory_predict(&cfg, &plan, &p) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "offload 7") != NULL, "%s", mt_last_error());

    plan.offload = MT_OFFLOAD_NONE;
    mt_gpt_memory_prediction none = predict(&plan);
    CHECK(none.host_total_peak == 0);
    plan.offload = MT_OFFLOAD_FULL;
    mt_gpt_memory_prediction full = predict(&plan);
    size_t block = 49984 * sizeof(float);
    CHECK_MSG(full.host_peak[MT_MEM_COMM] == block, "landing %zu, block shard %zu",
              full.host_peak[MT_MEM_COMM], block);
    /* f32: AdamW's m and v move whole; master and gradient shards are equal in size. */
    CHECK(full.peak[MT_MEM_OPTIMIZER] == 0);
    CHECK(full.host_peak[MT_MEM_OPTIMIZER] == none.peak[MT_MEM_OPTIMIZER]);
    CHECK(full.host_peak[MT_MEM_PARAMS] == full.host_peak[MT_MEM_GRADS]);
    CHECK(full.host_peak[MT_MEM_OPTIMIZER] == 2 * full.host_peak[MT_MEM_PARAMS]);
    CHECK(full.host_total_peak == 4 * full.host_peak[MT_MEM_PARAMS] + block);
    CHECK(full.total_peak < none.total_peak);
    /* cfg is created eagerly: every parameter in f32 (the root's 64 x 64 + 32 x 64 + 2 x 64 and
     * three blocks), and no offloaded shard comes onto the device after them. */
    CHECK_MSG(full.setup_peak == (6272 + 3 * 49984) * sizeof(float), "setup %zu",
              full.setup_peak);
    plan.offload_ratio = 0.0f; /* no unit offloaded: as without offload */
    mt_gpt_memory_prediction zero = predict(&plan);
    CHECK(zero.host_total_peak == 0 && zero.total_peak == none.total_peak);
    CHECK(!memcmp(zero.peak, none.peak, sizeof zero.peak));
}

int main(void) {
    test_offload();
    test_errors();
    test_model_refusals();
    test_activation_checkpointing();
    test_sequence_parallel();
    test_sequence_parallel_recompute();
    return check_report("test_gpt_memory");
}
