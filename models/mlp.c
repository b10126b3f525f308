/* The reference MLP (include/meshtrain/mlp.h): Linear -> ReLU -> ... -> Linear, MSE loss.
 *
 * The root module has no parameters of its own; its forward runs the layers in order and takes
 * the loss, its backward starts from the loss gradient and runs the layers in reverse. Every
 * layer goes through mt_module_forward/backward so that FSDP gathers its parameters around it.
 * Activations live on the device (activations category) for one forward/backward pass: layer l's
 * output is kept until layer l's backward has used it, then freed, so the activation memory
 * shrinks as backward proceeds. */
#include "core/error.h"
#include "models/mlp_internal.h"
#include "models/model_common.h"
#include "module/param_hash.h"

#include <meshtrain/init.h>
#include <meshtrain/mlp.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mlp_layer {
    int index;
    int in, out;
    bool last; /* no ReLU after the last layer */
    mt_param *w, *b;
} mlp_layer;

struct mt_mlp {
    mt_mlp_config cfg;
    mt_device *dev;
    mt_module *root;
    mt_module **layer_modules;
    mlp_layer *layers;
    size_t n_params;
};

/* One forward (and backward) pass: the ctx every module function receives. */
typedef struct mlp_pass {
    mt_mlp *mlp;
    int batch;
    float **acts;   /* acts[0]: the input; acts[l + 1]: layer l's output (after its ReLU) */
    float *target;  /* batch x out_dim */
    float *d_act;   /* during backward: the gradient of the current layer's output */
    float grad_scale;
    float loss;
} mlp_pass;

/* ---- deterministic data -------------------------------------------------------------------- */

enum { TAG_INPUT = 3, TAG_TEACHER = 4 };

/* Uniform in [-1, 1) from a counter: the same value for the same key on any rank. */
static double hash_uniform(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t h = mt_hash_mix64(b ^ mt_hash_mix64(c));
    h = mt_hash_mix64(seed ^ mt_hash_mix64(tag ^ mt_hash_mix64(a ^ h)));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
}

/* ---- the layers' module functions ------------------------------------------------------------ */

static mt_status layer_forward(mt_module *module, void *ctx) {
    mlp_layer *layer = mt_module_user(module);
    mlp_pass *pass = ctx;
    mt_device *dev = pass->mlp->dev;
    size_t n_out = (size_t)pass->batch * (size_t)layer->out;
    /* Weight and bias as f32 (converted copies under a bf16 param_dtype). */
    mt_param *ps[2] = {layer->w, layer->b};
    const void *wb[2];
    mt_dtype dt[2];
    float *scratch[2] = {0}, *out = NULL;
    mt_status st = mt_model_param_values(dev, "mlp", ps, 2, NULL, wb, dt, scratch);
    if (st == MT_OK) st = mt_model_act_alloc(dev, n_out, false, &out);
    if (st == MT_OK)
        st = mt_op_linear_forward(dev, pass->acts[layer->index], wb[0], wb[1], out, pass->batch,
                                  layer->in, layer->out);
    /* ReLU in place: its backward only needs the output. */
    if (st == MT_OK && !layer->last) st = mt_op_relu_forward(dev, out, out, n_out);
    mt_model_free_all(dev, scratch, 2);
    if (st != MT_OK) {
        mt_device_free(dev, out);
        return mt_error_wrap(st, "mlp: forward of layer %d", layer->index);
    }
    pass->acts[layer->index + 1] = out;
    return MT_OK;
}

static mt_status layer_backward(mt_module *module, void *ctx) {
    mlp_layer *layer = mt_module_user(module);
    mlp_pass *pass = ctx;
    mt_device *dev = pass->mlp->dev;
    size_t n_out = (size_t)pass->batch * (size_t)layer->out;
    mt_param *ps[2] = {layer->w, layer->b};
    float *grads[2]; /* d_w, d_b */
    MT_TRY(mt_model_param_grads("mlp", module, ps, 2, grads));
    float *d_z = NULL, *d_in = NULL, *w_tmp = NULL;
    const void *w = NULL;
    mt_dtype w_dtype;
    mt_status st = MT_OK;
    if (layer->last) {
        d_z = pass->d_act;
    } else {
        st = mt_model_act_alloc(dev, n_out, true, &d_z);
        if (st == MT_OK)
            st = mt_op_relu_backward(dev, pass->acts[layer->index + 1], pass->d_act, d_z, n_out);
    }
    /* The first layer's input gradient is not needed, nor is the weight that makes it. */
    if (st == MT_OK && layer->index > 0) {
        st = mt_model_act_alloc(dev, (size_t)pass->batch * (size_t)layer->in, true, &d_in);
        if (st == MT_OK)
            st = mt_model_param_values(dev, "mlp", ps, 1, NULL, &w, &w_dtype, &w_tmp);
    }
    if (st == MT_OK)
        st = mt_op_linear_backward(dev, d_z, pass->acts[layer->index], w, d_in, grads[0],
                                   grads[1], pass->batch, layer->in, layer->out);
    mt_device_free(dev, w_tmp);
    if (d_z != pass->d_act) mt_device_free(dev, d_z);
    if (st != MT_OK) {
        mt_device_free(dev, d_in);
        return mt_error_wrap(st, "mlp: backward of layer %d", layer->index);
    }
    /* This layer's output and its gradient are used up. */
    mt_device_free(dev, pass->d_act);
    pass->d_act = d_in;
    mt_device_free(dev, pass->acts[layer->index + 1]);
    pass->acts[layer->index + 1] = NULL;
    return MT_OK;
}

/* ---- the root's module functions ------------------------------------------------------------- */

static mt_status root_forward(mt_module *module, void *ctx) {
    mt_mlp *mlp = mt_module_user(module);
    mlp_pass *pass = ctx;
    for (int l = 0; l < mlp->cfg.layers; l++)
        MT_TRY(mt_module_forward(mlp->layer_modules[l], pass));
    size_t n = (size_t)pass->batch * (size_t)mlp->cfg.out_dim;
    return mt_op_mse_forward(mlp->dev, pass->acts[mlp->cfg.layers], pass->target, n, &pass->loss);
}

static mt_status root_backward(mt_module *module, void *ctx) {
    mt_mlp *mlp = mt_module_user(module);
    mlp_pass *pass = ctx;
    size_t n = (size_t)pass->batch * (size_t)mlp->cfg.out_dim;
    MT_TRY(mt_model_act_alloc(mlp->dev, n, true, &pass->d_act));
    MT_TRY(mt_op_mse_backward(mlp->dev, pass->acts[mlp->cfg.layers], pass->target, n,
                              pass->grad_scale, pass->d_act));
    for (int l = mlp->cfg.layers - 1; l >= 0; l--)
        MT_TRY(mt_module_backward(mlp->layer_modules[l], pass));
    return MT_OK;
}

/* ---- creation -------------------------------------------------------------------------------- */

static mt_status add_layer(mt_mlp *mlp, mt_mesh *mesh, int l) {
    mlp_layer *layer = &mlp->layers[l];
    const mt_mlp_config *c = &mlp->cfg;
    layer->index = l;
    layer->in = l == 0 ? c->in_dim : c->width;
    layer->last = l == c->layers - 1;
    layer->out = layer->last ? c->out_dim : c->width;

    char name[32];
    snprintf(name, sizeof name, "layer%d", l);
    static const mt_module_ops ops = {.forward = layer_forward, .backward = layer_backward};
    mt_module *m = NULL;
    MT_TRY(mt_model_add_child(mesh, mlp->root, name, &ops, layer, &m));
    mlp->layer_modules[l] = m;

    mt_tp_placement rep = {.kind = MT_TP_REPLICATE, .dim = 0};
    int64_t w_shape[2] = {layer->out, layer->in}, b_shape[1] = {layer->out};
    MT_TRY(mt_module_add_param_deferred(m, "weight", 2, w_shape, rep, &layer->w));
    MT_TRY(mt_module_add_param_deferred(m, "bias", 1, b_shape, rep, &layer->b));
    /* PyTorch's default for nn.Linear: uniform in +-1/sqrt(fan_in), weight and bias alike; each
     * tensor its own stream of the seed. Run by mt_mlp_create, or after sharding (defer_init). */
    double bound = 1.0 / sqrt((double)layer->in);
    mt_initialiser w_init = mt_init_uniform(-bound, bound, c->seed, 2 * (uint64_t)l);
    mt_initialiser b_init = mt_init_uniform(-bound, bound, c->seed, 2 * (uint64_t)l + 1);
    MT_TRY(mt_param_set_init(layer->w, &w_init));
    MT_TRY(mt_param_set_init(layer->b, &b_init));
    mlp->n_params += (size_t)layer->out * (size_t)layer->in + (size_t)layer->out;
    return MT_OK;
}

mt_status mt_mlp_create(mt_mesh *mesh, const mt_mlp_config *config, mt_mlp **out) {
    if (!mesh || !config || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mlp: mesh, config and out must not be NULL");
    *out = NULL;
    const mt_mlp_config *c = config;
    if (c->layers < 1 || c->in_dim < 1 || c->width < 1 || c->out_dim < 1)
        return mt_error(MT_ERR_INVALID_ARG,
                        "mlp: layers %d, in_dim %d, width %d, out_dim %d: each must be >= 1",
                        c->layers, c->in_dim, c->width, c->out_dim);
    mt_mlp *mlp = calloc(1, sizeof *mlp);
    if (mlp) {
        mlp->layer_modules = calloc((size_t)c->layers, sizeof *mlp->layer_modules);
        mlp->layers = calloc((size_t)c->layers, sizeof *mlp->layers);
    }
    if (!mlp || !mlp->layer_modules || !mlp->layers) {
        mt_mlp_destroy(mlp);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "mlp: out of host memory for %d layers", c->layers);
    }
    mlp->cfg = *c;
    mlp->dev = mt_runtime_device(mt_mesh_runtime(mesh));
    static const mt_module_ops root_ops = {.forward = root_forward, .backward = root_backward};
    mt_status st = mt_module_create(mesh, "mlp", &root_ops, mlp, &mlp->root);
    for (int l = 0; l < c->layers && st == MT_OK; l++) st = add_layer(mlp, mesh, l);
    if (st == MT_OK && !c->defer_init) st = mt_module_init_params(mlp->root);
    if (st != MT_OK) {
        mt_mlp_destroy(mlp);
        return st;
    }
    *out = mlp;
    return MT_OK;
}

void mt_mlp_destroy(mt_mlp *mlp) {
    if (!mlp) return;
    mt_module_destroy(mlp->root); /* and the layers, its children */
    free(mlp->layer_modules);
    free(mlp->layers);
    free(mlp);
}

mt_module *mt_mlp_root(mt_mlp *mlp) { return mlp ? mlp->root : NULL; }

mt_module *mt_mlp_layer(mt_mlp *mlp, int l) {
    if (!mlp || l < 0 || l >= mlp->cfg.layers) return NULL;
    return mlp->layer_modules[l];
}

size_t mt_mlp_param_count(const mt_mlp *mlp) { return mlp ? mlp->n_params : 0; }

/* ---- passes ---------------------------------------------------------------------------------- */

static void pass_release(mlp_pass *pass) {
    mt_device *dev = pass->mlp->dev;
    if (pass->acts)
        for (int l = 0; l <= pass->mlp->cfg.layers; l++) mt_device_free(dev, pass->acts[l]);
    free(pass->acts);
    mt_device_free(dev, pass->d_act);
    mt_device_free(dev, pass->target);
}

/* Copies this rank's batch to the device. */
static mt_status pass_prepare(mt_mlp *mlp, const float *x, const float *y, int batch,
                              mlp_pass *pass) {
    memset(pass, 0, sizeof *pass);
    pass->mlp = mlp;
    pass->batch = batch;
    if (!x || !y || batch < 1)
        return mt_error(MT_ERR_INVALID_ARG, "mlp: a pass needs inputs, targets and batch >= 1 "
                        "(batch %d)", batch);
    pass->acts = calloc((size_t)mlp->cfg.layers + 1, sizeof *pass->acts);
    if (!pass->acts) return mt_error(MT_ERR_OUT_OF_MEMORY, "mlp: out of host memory for a pass");
    size_t nx = (size_t)batch * (size_t)mlp->cfg.in_dim, ny = (size_t)batch * mlp->cfg.out_dim;
    MT_TRY(mt_model_act_alloc(mlp->dev, nx, false, &pass->acts[0]));
    MT_TRY(mt_model_act_alloc(mlp->dev, ny, false, &pass->target));
    MT_TRY(mt_device_copy(mlp->dev, pass->acts[0], x, nx * sizeof(float), MT_COPY_HOST_TO_DEVICE,
                          NULL));
    return mt_device_copy(mlp->dev, pass->target, y, ny * sizeof(float), MT_COPY_HOST_TO_DEVICE,
                          NULL);
}

mt_status mt_mlp_forward_backward(mt_mlp *mlp, const float *x, const float *y, int batch,
                                  float grad_scale, float *loss) {
    if (!mlp) return mt_error(MT_ERR_INVALID_ARG, "mlp: forward_backward on a NULL model");
    mlp_pass pass;
    mt_status st = pass_prepare(mlp, x, y, batch, &pass);
    pass.grad_scale = grad_scale;
    if (st == MT_OK) st = mt_module_forward(mlp->root, &pass);
    if (st == MT_OK) st = mt_module_backward(mlp->root, &pass);
    if (st == MT_OK && loss) *loss = pass.loss;
    pass_release(&pass);
    return st;
}

mt_status mt_mlp_forward(mt_mlp *mlp, const float *x, const float *y, int batch, float *loss) {
    if (!mlp) return mt_error(MT_ERR_INVALID_ARG, "mlp: forward on a NULL model");
    mlp_pass pass;
    mt_status st = pass_prepare(mlp, x, y, batch, &pass);
    if (st == MT_OK) st = mt_module_forward(mlp->root, &pass);
    if (st == MT_OK && loss) *loss = pass.loss;
    pass_release(&pass);
    return st;
}

/* ---- synthetic data -------------------------------------------------------------------------- */

void mt_mlp_synthetic_batch(const mt_mlp_config *config, uint64_t seed, long step, long first,
                            int n, float *x, float *y) {
    if (!config || n < 1 || !x || !y) return;
    int in = config->in_dim, out = config->out_dim;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < in; j++)
            x[(size_t)i * in + j] = (float)hash_uniform(seed, TAG_INPUT, (uint64_t)step,
                                                        (uint64_t)(first + i), (uint64_t)j);
    /* The teacher: y = tanh(A x) with A fixed by the seed, scaled so that A x has unit-order
     * spread (x is uniform in [-1, 1): variance 1/3; A's entries: variance 3 / in). A linear map
     * through a saturating function is something an MLP learns quickly but not trivially. */
    double scale = 3.0 / sqrt((double)in);
    float *a = malloc((size_t)out * (size_t)in * sizeof *a);
    for (int o = 0; a && o < out; o++)
        for (int j = 0; j < in; j++)
            a[(size_t)o * in + j] =
                (float)(scale * hash_uniform(seed, TAG_TEACHER, (uint64_t)o, (uint64_t)j, 0));
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * in;
        for (int o = 0; o < out; o++) {
            double z = 0.0;
            for (int j = 0; j < in; j++) {
                /* Without memory for A, each entry is recomputed: slower, the same values. */
                float aij = a ? a[(size_t)o * in + j]
                              : (float)(scale * hash_uniform(seed, TAG_TEACHER, (uint64_t)o,
                                                             (uint64_t)j, 0));
                z += (double)aij * xi[j];
            }
            y[(size_t)i * out + o] = (float)tanh(z);
        }
    }
    free(a);
}
