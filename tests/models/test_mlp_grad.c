/* The reference MLP (models/mlp.c) through the FSDP engine on one rank (run under mtrun):
 * the loss against a double-precision forward of the same parameters, every gradient against
 * finite differences of that forward, accumulation (+=), grad_scale, mt_zero_grad, gradient
 * clipping and one AdamW step against the formula, for param_dtype f32 and bf16 (bf16: the
 * reference uses the bf16-rounded parameters the layers compute with). */
#include "check.h"
#include "numeric.h"
#include "fsdp/fsdp_shards.h"
#include "models/mlp_internal.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { LAYERS = 3, IN = 5, WIDTH = 7, OUT = 4, BATCH = 6 };

static const mt_mlp_config CFG = {.layers = LAYERS, .in_dim = IN, .width = WIDTH, .out_dim = OUT,
                                  .seed = 11};

typedef struct ref_model {
    int in[LAYERS], out[LAYERS];
    double *w[LAYERS], *b[LAYERS];
} ref_model;

/* Mean squared error of the MLP in double. */
static double ref_loss(const ref_model *m, const float *x, const float *y) {
    double act[BATCH * WIDTH > BATCH * IN ? BATCH * WIDTH : BATCH * IN], next[BATCH * WIDTH];
    for (int i = 0; i < BATCH * IN; i++) act[i] = x[i];
    for (int l = 0; l < LAYERS; l++) {
        for (int s = 0; s < BATCH; s++)
            for (int o = 0; o < m->out[l]; o++) {
                double z = m->b[l][o];
                for (int j = 0; j < m->in[l]; j++) z += m->w[l][o * m->in[l] + j] * act[s * m->in[l] + j];
                next[s * m->out[l] + o] = l < LAYERS - 1 && z < 0 ? 0.0 : z;
            }
        memcpy(act, next, sizeof(double) * BATCH * m->out[l]);
    }
    double sum = 0.0;
    for (int i = 0; i < BATCH * OUT; i++) sum += (act[i] - y[i]) * (act[i] - y[i]);
    return sum / (BATCH * OUT);
}

static double fd(ref_model *m, double *p, const float *x, const float *y) {
    const double h = 1e-6, keep = *p;
    *p = keep + h;
    double up = ref_loss(m, x, y);
    *p = keep - h;
    double down = ref_loss(m, x, y);
    *p = keep;
    return (up - down) / (2 * h);
}

static double as_computed(float v, mt_dtype dtype) {
    return dtype == MT_BF16 ? (double)mt_bf16_to_f32(mt_f32_to_bf16(v)) : (double)v;
}

static void run_case(mt_runtime *rt, mt_mesh *mesh, mt_dtype dtype) {
    printf("-- param_dtype %s\n", mt_dtype_name(dtype));
    mt_mlp *mlp = NULL;
    CHECK_OK(mt_mlp_create(mesh, &CFG, &mlp));
    if (!mlp) return;
    CHECK(mt_mlp_param_count(mlp) == (size_t)(IN * WIDTH + WIDTH + WIDTH * WIDTH + WIDTH +
                                              WIDTH * OUT + OUT));
    mt_fsdp_options fo = mt_fsdp_defaults(mesh, "dp");
    fo.param_dtype = dtype;
    for (int l = 0; l < LAYERS; l++) CHECK_OK(mt_fsdp_shard(mt_mlp_layer(mlp, l), &fo));
    mt_module *root = mt_mlp_root(mlp);
    CHECK_OK(mt_fsdp_shard(root, &fo));

    /* One rank: each layer's shard is its whole flat buffer, weight then bias. */
    mt_fsdp_shard_view *views = NULL;
    size_t nv = 0;
    CHECK_OK(mt_fsdp_collect_shards(root, &views, &nv));
    CHECK_MSG(nv == LAYERS + 1, "%zu shard views", nv);
    if (nv != LAYERS + 1) {
        free(views);
        mt_mlp_destroy(mlp);
        return;
    }
    ref_model ref;
    bool layout_ok = true;
    for (int l = 0; l < LAYERS; l++) {
        ref.in[l] = l == 0 ? IN : WIDTH;
        ref.out[l] = l == LAYERS - 1 ? OUT : WIDTH;
        const mt_fsdp_shard_view *v = &views[l];
        size_t nw = (size_t)ref.in[l] * ref.out[l];
        layout_ok = layout_ok && v->n_ranges == 2 && v->ranges[0].end - v->ranges[0].begin == nw &&
                    v->ranges[1].end - v->ranges[1].begin == (size_t)ref.out[l];
        ref.w[l] = malloc(nw * sizeof(double));
        ref.b[l] = malloc((size_t)ref.out[l] * sizeof(double));
    }
    CHECK_MSG(layout_ok, "each layer's shard holds two ranges: weight and bias");
    if (!layout_ok) goto out;
    for (int l = 0; l < LAYERS; l++) {
        const mt_fsdp_shard_view *v = &views[l];
        for (int i = 0; i < ref.in[l] * ref.out[l]; i++)
            ref.w[l][i] = as_computed(v->param[v->ranges[0].begin + (size_t)i], dtype);
        for (int i = 0; i < ref.out[l]; i++)
            ref.b[l][i] = as_computed(v->param[v->ranges[1].begin + (size_t)i], dtype);
    }

    float x[BATCH * IN], y[BATCH * OUT];
    mt_mlp_synthetic_batch(&CFG, 5, 0, 0, BATCH, x, y);

    /* Loss and gradients, scaled by 0.5. */
    float loss = -1.0f;
    CHECK_OK(mt_mlp_forward_backward(mlp, x, y, BATCH, 0.5f, &loss));
    double want = ref_loss(&ref, x, y);
    CHECK_MSG(test_close_to(loss, want, 1e-5, 1e-7), "loss %.9g, reference %.9g", (double)loss,
              want);
    int bad = 0, total = 0;
    double sumsq = 0.0;
    for (int l = 0; l < LAYERS; l++) {
        const mt_fsdp_shard_view *v = &views[l];
        for (int r = 0; r < 2; r++) {
            double *p = r == 0 ? ref.w[l] : ref.b[l];
            int n = r == 0 ? ref.in[l] * ref.out[l] : ref.out[l];
            for (int i = 0; i < n; i++) {
                double g = v->grad[v->ranges[r].begin + (size_t)i], f = 0.5 * fd(&ref, &p[i], x, y);
                sumsq += g * g;
                total++;
                if (!test_close_to(g, f, 1e-3, 2e-6)) {
                    if (bad++ < 5)
                        fprintf(stderr, "layer %d %s[%d]: gradient %.8g, finite difference %.8g\n",
                                l, r ? "bias" : "weight", i, g, f);
                }
            }
        }
    }
    CHECK_MSG(bad == 0, "%d of %d gradients off the finite differences", bad, total);
    CHECK_MSG(sumsq > 0, "the gradients are not all zero");

    /* The forward uses the master shard: move one weight through the engine and see the loss
     * move as the gradient says (f32 only: bf16 rounding would hide a small step). */
    if (dtype == MT_F32) {
        float *p = &views[1].param[views[1].ranges[0].begin + 3];
        double g = 2.0 * views[1].grad[views[1].ranges[0].begin + 3];
        float keep = *p, up = 0, down = 0;
        const float h = 1e-2f;
        *p = keep + h;
        CHECK_OK(mt_fsdp_shards_updated(root));
        CHECK_OK(mt_mlp_forward(mlp, x, y, BATCH, &up));
        *p = keep - h;
        CHECK_OK(mt_fsdp_shards_updated(root));
        CHECK_OK(mt_mlp_forward(mlp, x, y, BATCH, &down));
        *p = keep;
        CHECK_OK(mt_fsdp_shards_updated(root));
        double engine_fd = ((double)up - down) / (2.0 * h);
        CHECK_MSG(test_close_to(engine_fd, g, 2e-2, 1e-4),
                  "engine finite difference %.6g, gradient %.6g", engine_fd, g);
    }

    /* Backward accumulates: the same batch again doubles every gradient. */
    float *first = malloc(views[0].n * sizeof *first);
    memcpy(first, views[0].grad, views[0].n * sizeof *first);
    CHECK_OK(mt_mlp_forward_backward(mlp, x, y, BATCH, 0.5f, &loss));
    bad = 0;
    for (size_t i = 0; i < views[0].n; i++)
        if (!test_close_to(views[0].grad[i], 2.0 * first[i], 1e-5, 1e-8)) bad++;
    CHECK_MSG(bad == 0, "%d gradients of layer 0 are not doubled by a second backward", bad);
    free(first);

    /* Clipping: the norm before clipping is returned, then the norm is max_norm. */
    float norm = 0.0f, norm_again = 0.0f;
    CHECK_OK(mt_clip_grad_norm(root, 0.0f, &norm));
    double want_norm = 2.0 * sqrt(sumsq);
    CHECK_MSG(test_close_to(norm, want_norm, 1e-5, 0), "norm %.8g, expected %.8g", (double)norm,
              want_norm);
    CHECK_OK(mt_clip_grad_norm(root, norm / 4.0f, &norm_again));
    CHECK(test_close_to(norm_again, norm, 1e-6, 0));
    CHECK_OK(mt_clip_grad_norm(root, 1e9f, &norm_again));
    CHECK_MSG(test_close_to(norm_again, norm / 4.0, 1e-4, 0),
              "norm after clipping %.8g, expected %.8g", (double)norm_again, norm / 4.0);

    /* One AdamW step: m = (1 - b1) g and v = (1 - b2) g^2 make the update lr * g / (|g| + eps)
     * after bias correction, plus decoupled weight decay. */
    mt_mem_stats before, after;
    mt_device_mem_stats(mt_runtime_device(rt), &before);
    mt_adamw *adam = NULL;
    const float lr = 0.01f, wd = 0.1f, eps = 1e-8f;
    CHECK_OK(mt_adamw_create(root, &(mt_adamw_options){.lr = lr, .weight_decay = wd}, &adam));
    mt_device_mem_stats(mt_runtime_device(rt), &after);
    size_t shard_elems = 0;
    for (size_t u = 0; u < nv; u++) shard_elems += views[u].n;
    CHECK_MSG(after.current[MT_MEM_OPTIMIZER] - before.current[MT_MEM_OPTIMIZER] ==
                  8 * shard_elems,
              "optimizer state %zu bytes for %zu shard elements",
              after.current[MT_MEM_OPTIMIZER] - before.current[MT_MEM_OPTIMIZER], shard_elems);
    size_t n2 = views[2].n;
    float *p0 = malloc(n2 * sizeof *p0), *g0 = malloc(n2 * sizeof *g0);
    memcpy(p0, views[2].param, n2 * sizeof *p0);
    memcpy(g0, views[2].grad, n2 * sizeof *g0);
    CHECK_OK(mt_adamw_step(adam));
    CHECK(mt_adamw_steps(adam) == 1);
    bad = 0;
    for (size_t i = 0; i < n2; i++) {
        double upd = p0[i] - lr * g0[i] / (fabs(g0[i]) + eps) - (double)lr * wd * p0[i];
        if (!test_close_to(views[2].param[i], upd, 1e-5, 1e-7)) bad++;
    }
    CHECK_MSG(bad == 0, "%d parameters of layer 2 off the AdamW formula after one step", bad);
    free(p0);
    free(g0);
    mt_adamw_destroy(adam);

    CHECK_OK(mt_zero_grad(root));
    /* Read as the optimizer does: views collected after the zeroing (which only marks CPU
     * shards; collecting writes the zeros they stand for). */
    free(views);
    views = NULL;
    CHECK_OK(mt_fsdp_collect_shards(root, &views, &nv));
    bad = 0;
    for (size_t u = 0; views && u < nv; u++)
        for (size_t i = 0; i < views[u].n; i++)
            if (views[u].grad[i] != 0.0f) bad++;
    CHECK_MSG(bad == 0, "%d gradients not zero after mt_zero_grad", bad);

    /* A pass on an unsharded MLP has no gradient buffers: an error, not a crash. */
    mt_mlp *plain = NULL;
    CHECK_OK(mt_mlp_create(mesh, &CFG, &plain));
    if (plain) {
        CHECK(mt_mlp_forward_backward(plain, x, y, BATCH, 1.0f, &loss) != MT_OK);
        CHECK(strstr(mt_last_error(), "gradient") != NULL);
        CHECK_OK(mt_mlp_forward(plain, x, y, BATCH, &loss));
        CHECK_MSG(dtype != MT_F32 || test_close_to(loss, want, 1e-5, 1e-7),
                  "unsharded loss %.9g, reference %.9g", (double)loss, want);
        mt_mlp_destroy(plain);
    }
out:
    for (int l = 0; l < LAYERS; l++) {
        free(ref.w[l]);
        free(ref.b[l]);
    }
    free(views);
    mt_mlp_destroy(mlp);
}

int main(void) {
    mt_runtime *rt = NULL;
    CHECK_OK(mt_init(&rt, NULL, NULL));
    if (!rt) return check_report("test_mlp_grad");
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 1, (int[]){mt_runtime_world_size(rt)}, (const char *[]){"dp"},
                            &mesh));
    if (mesh) {
        mt_mlp *bad = NULL;
        CHECK(mt_mlp_create(mesh, &(mt_mlp_config){.layers = 0, .in_dim = 1, .width = 1,
                                                   .out_dim = 1}, &bad) == MT_ERR_INVALID_ARG);
        run_case(rt, mesh, MT_F32);
        run_case(rt, mesh, MT_BF16);
        mt_mesh_destroy(mesh);
    }
    mt_finalize(rt);
    return check_report("test_mlp_grad");
}
