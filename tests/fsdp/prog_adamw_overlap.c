/* The overlapped optimizer step (mt_adamw_set_overlap, docs/offload.md) on every rank of the
 * launch: two identical MLPs with offloaded shards, one stepped with the overlap and one without,
 * give the same losses and AdamW state bit for bit over several steps; the overlap stepped units
 * while the backward ran (mt_adamw_overlapped_units > 0, 0 without it); clipping is refused while
 * it is on (computing the norm alone is not) and accepted once it is off; a model with no unit
 * offloaded refuses it; a second synchronising backward before the step fails, naming the unit.
 * A landing waits for the parameter copy of its own unit only: during a backward every unit is
 * quiesced exactly once (its own landing), not once per landing of any unit (the hook used to
 * collect and quiesce every unit's view at each landing, waiting for the staging run ahead).
 * usage: prog_adamw_overlap optimizer|full */
#include "fsdp/fsdp_internal.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS 4
#define WIDTH 64
#define BATCH 4
#define STEPS 6

static int failures;
static int rank;

#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__);             \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fprintf(stderr, " (last error: %s)\n", mt_last_error());                       \
            failures++;                                                                     \
        }                                                                                   \
    } while (0)

typedef struct model {
    mt_mlp *mlp;
    mt_adamw *opt;
} model;

static mt_status make(mt_mesh *mesh, mt_offload policy, model *m) {
    mt_mlp_config cfg = {.layers = LAYERS, .in_dim = WIDTH, .width = WIDTH, .out_dim = WIDTH,
                         .seed = 3, .defer_init = true};
    MT_TRY(mt_mlp_create(mesh, &cfg, &m->mlp));
    mt_fsdp_options o = mt_fsdp_defaults(mesh, "dp");
    o.offload = policy;
    for (int l = 0; l < LAYERS; l++) MT_TRY(mt_fsdp_shard(mt_mlp_layer(m->mlp, l), &o));
    MT_TRY(mt_fsdp_shard(mt_mlp_root(m->mlp), &o));
    MT_TRY(mt_module_init_params(mt_mlp_root(m->mlp)));
    return mt_adamw_create(mt_mlp_root(m->mlp), &(mt_adamw_options){.lr = 1e-2f}, &m->opt);
}

/* The quiesce counters (fsdp_internal.h) of the LAYERS layers and the root, in that order. */
static void quiesces(model *m, long *out) {
    for (int u = 0; u <= LAYERS; u++) {
        mt_module *mod = u < LAYERS ? mt_mlp_layer(m->mlp, u) : mt_mlp_root(m->mlp);
        mt_fsdp_debug d = {0};
        if (mt_fsdp_debug_get(mod, &d) != MT_OK) d.quiesces = -1000;
        out[u] = d.quiesces;
    }
}

static void drop(model *m) {
    if (m->opt) mt_adamw_destroy(m->opt);
    if (m->mlp) mt_mlp_destroy(m->mlp);
}

/* Every unit's AdamW state (host tier for offloaded units) of a and b equal bit for bit. */
static int same_state(model *a, model *b) {
    size_t n = mt_adamw_unit_count(a->opt);
    if (n != mt_adamw_unit_count(b->opt)) return 0;
    for (size_t u = 0; u < n; u++) {
        float *ma, *va, *mb, *vb;
        size_t na, nb;
        if (mt_adamw_state(a->opt, u, &ma, &va, &na) != MT_OK ||
            mt_adamw_state(b->opt, u, &mb, &vb, &nb) != MT_OK || na != nb)
            return 0;
        if (na && (memcmp(ma, mb, na * sizeof *ma) || memcmp(va, vb, na * sizeof *va))) return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    mt_offload policy = argc > 1 && !strcmp(argv[1], "full") ? MT_OFFLOAD_FULL
                                                             : MT_OFFLOAD_OPTIMIZER;
    mt_runtime *rt = NULL;
    mt_mesh *mesh = NULL;
    if (mt_init(&rt, NULL, NULL) != MT_OK) {
        fprintf(stderr, "mt_init: %s\n", mt_last_error());
        return 1;
    }
    rank = mt_runtime_rank(rt);
    int world = mt_runtime_world_size(rt);
    const char *dp = "dp";
    CHECK(mt_mesh_create(rt, 1, &world, &dp, &mesh) == MT_OK, "mesh");
    model ov = {0}, plain = {0}, resident = {0};
    CHECK(make(mesh, policy, &ov) == MT_OK, "model with overlap");
    CHECK(make(mesh, policy, &plain) == MT_OK, "model without overlap");
    CHECK(make(mesh, MT_OFFLOAD_NONE, &resident) == MT_OK, "resident model");
    if (failures) goto out;

    /* Nothing offloaded: nothing to overlap, said so. */
    CHECK(mt_adamw_set_overlap(resident.opt, true) == MT_ERR_INVALID_ARG &&
              strstr(mt_last_error(), "is offloaded"),
          "overlap on a resident model refused");
    CHECK(mt_adamw_set_overlap(ov.opt, true) == MT_OK, "overlap on");

    float x[BATCH * WIDTH], y[BATCH * WIDTH];
    for (int i = 0; i < BATCH * WIDTH; i++) {
        x[i] = sinf(0.05f * (float)i + 0.7f * (float)rank);
        y[i] = tanhf(2.0f * x[i]);
    }
    for (int s = 0; s < STEPS && !failures; s++) {
        float la = 0, lb = 0, norm = 0;
        long q0[LAYERS + 1], q1[LAYERS + 1];
        quiesces(&ov, q0);
        CHECK(mt_mlp_forward_backward(ov.mlp, x, y, BATCH, 1.0f, &la) == MT_OK, "backward");
        quiesces(&ov, q1);
        /* The layers land during the backward; the root's gradient may land only when the
         * step collects the shards. */
        for (int u = 0; u <= LAYERS; u++)
            CHECK(q1[u] - q0[u] == 1 || (u == LAYERS && q1[u] == q0[u]),
                  "step %d: unit %d quiesced %ld times during the backward (once, at its own "
                  "landing, expected)", s, u, q1[u] - q0[u]);
        /* The norm alone is allowed: it reads gradients the overlapped step does not change. */
        CHECK(mt_clip_grad_norm(mt_mlp_root(ov.mlp), 0.0f, &norm) == MT_OK, "norm only");
        if (s == STEPS - 1)
            CHECK(mt_clip_grad_norm(mt_mlp_root(ov.mlp), 1.0f, &norm) == MT_ERR_INVALID_ARG &&
                      strstr(mt_last_error(), "overlapped optimizer step is on"),
                  "clipping refused while the overlap is on");
        CHECK(mt_adamw_step(ov.opt) == MT_OK, "overlapped step %d", s);
        CHECK(mt_zero_grad(mt_mlp_root(ov.mlp)) == MT_OK, "zero grad");
        CHECK(mt_mlp_forward_backward(plain.mlp, x, y, BATCH, 1.0f, &lb) == MT_OK, "backward");
        CHECK(mt_adamw_step(plain.opt) == MT_OK, "plain step %d", s);
        CHECK(mt_zero_grad(mt_mlp_root(plain.mlp)) == MT_OK, "zero grad");
        CHECK(memcmp(&la, &lb, sizeof la) == 0, "step %d: loss %.9g with overlap, %.9g without",
              s, (double)la, (double)lb);
        CHECK(same_state(&ov, &plain), "step %d: AdamW state differs", s);
        /* The root lands at the end of the backward; the LAYERS layers land during it. */
        CHECK(mt_adamw_overlapped_units(ov.opt) > 0, "step %d: no unit stepped during the "
              "backward (%ld)", s, mt_adamw_overlapped_units(ov.opt));
        CHECK(mt_adamw_overlapped_units(plain.opt) == 0, "counter without overlap");
    }
    if (rank == 0)
        printf("overlapped units of the last step: %ld of %zu\n",
               mt_adamw_overlapped_units(ov.opt), mt_adamw_unit_count(ov.opt));

    /* Off again: clipping is accepted. */
    {
        float l = 0, norm = 0;
        CHECK(mt_adamw_set_overlap(ov.opt, false) == MT_OK, "overlap off");
        CHECK(mt_mlp_forward_backward(ov.mlp, x, y, BATCH, 1.0f, &l) == MT_OK, "backward");
        CHECK(mt_clip_grad_norm(mt_mlp_root(ov.mlp), 1.0f, &norm) == MT_OK, "clip once off");
        CHECK(mt_adamw_step(ov.opt) == MT_OK, "step once off");
        CHECK(mt_zero_grad(mt_mlp_root(ov.mlp)) == MT_OK, "zero grad");
    }
    /* Two synchronising backwards before one step: the overlap would step on the first. */
    if (!failures) {
        float l = 0;
        CHECK(mt_adamw_set_overlap(ov.opt, true) == MT_OK, "overlap on again");
        CHECK(mt_mlp_forward_backward(ov.mlp, x, y, BATCH, 1.0f, &l) == MT_OK, "backward");
        CHECK(mt_mlp_forward_backward(ov.mlp, x, y, BATCH, 1.0f, &l) == MT_ERR_INVALID_ARG &&
                  strstr(mt_last_error(), "second synchronised gradient"),
              "a second synchronising backward refused");
    }
out:
    drop(&resident);
    drop(&plain);
    drop(&ov);
    if (mesh) mt_mesh_destroy(mesh);
    mt_finalize(rt);
    if (rank == 0) printf(failures ? "FAILED\n" : "PASSED\n");
    return failures ? 1 : 0;
}
