/* custom_model: a model of your own, trained with FSDP. What docs/custom-model.md explains, as one
 * program to copy from:
 *
 *   mtrun --standalone --nproc_per_node 4 custom_model --steps 20
 *
 * The model is a three-layer network written with meshtrain's modules and ops, not a bundled one:
 *
 *   x [B x 16] -> fc1 (16 -> 32) -> tanh -> fc2 (32 -> 32) -> silu -> head (32 -> 4) -> MSE to y
 *
 * Every layer is a module owning its weight and bias; the root module "net" owns nothing, runs the
 * layers and computes the loss. Each layer is an FSDP unit, then the root. Ranks split a global
 * batch; the loss printed is the global batch's, the same whatever the number of ranks.
 *
 * Options: --steps N (20) --batch N (global, 32) --lr X (1e-2) --param-dtype f32|bf16 (f32)
 *          --seed N (1) --fail-on-rank R (a deliberate error in fc2's forward on rank R, to see
 *          how a job ends when one rank's module fails)
 */
#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { IN = 16, HIDDEN = 32, OUT = 4, LAYERS = 3 };
typedef enum { ACT_NONE, ACT_TANH, ACT_SILU } activation;

typedef struct options {
    int steps, batch, fail_on_rank;
    float lr;
    uint64_t seed;
    mt_dtype param_dtype;
} options;

/* A layer's own state (mt_module_user): its shape, activation and parameters. */
typedef struct layer {
    int index, in, out;
    activation act;
    mt_param *w, *b;
    int fail_on_rank; /* -1: never */
} layer;

/* What one forward/backward pass shares between the modules (the ctx of mt_module_forward): the
 * batch and every activation, in device memory. act[0] is the input, pre[l] layer l's output
 * before its activation, act[l + 1] after it; d_* are their gradients. */
typedef struct pass {
    mt_device *dev;
    int rank, rows;
    const float *y;
    float *act[LAYERS + 1], *pre[LAYERS], *d_act[LAYERS + 1], *d_pre[LAYERS];
    float *bias32; /* a bias widened to f32 when parameters are bf16 */
    float loss;
} pass;

/* ---- the layers ------------------------------------------------------------------------------ */

/* The bias as f32: the ops take an f32 bias, while FSDP hands out parameters in its param_dtype
 * (bf16 with --param-dtype bf16). A weight can stay bf16: the _ex linears multiply bf16 inputs
 * with f32 accumulation. */
static mt_status bias_f32(pass *p, mt_param *b, const float **out) {
    if (mt_param_dtype(b) == MT_F32) {
        *out = mt_param_f32(b);
        return *out ? MT_OK : MT_ERR_INVALID_ARG; /* mt_param_f32 said why */
    }
    *out = p->bias32;
    return mt_op_cast(p->dev, mt_param_data(b), mt_param_dtype(b), p->bias32, MT_F32,
                      mt_param_numel(b));
}

static mt_status layer_forward(mt_module *m, void *ctx) {
    layer *L = mt_module_user(m);
    pass *p = ctx;
    if (L->fail_on_rank == p->rank)
        return mt_error_set(MT_ERR_INVALID_ARG, "a deliberate error on rank %d (--fail-on-rank)",
                            p->rank);
    const float *b = NULL;
    MT_TRY(bias_f32(p, L->b, &b));
    float *pre = p->pre[L->index], *out = p->act[L->index + 1];
    MT_TRY(mt_op_linear_forward_ex(p->dev, p->act[L->index], mt_param_data(L->w),
                                   mt_param_dtype(L->w), b, pre, p->rows, L->in, L->out));
    size_t n = (size_t)p->rows * (size_t)L->out;
    switch (L->act) {
    case ACT_TANH: return mt_op_tanh_forward(p->dev, pre, out, n);
    case ACT_SILU: return mt_op_silu_forward(p->dev, pre, out, n);
    case ACT_NONE: break;
    }
    return mt_device_copy(p->dev, out, pre, n * sizeof *out, MT_COPY_DEVICE_TO_DEVICE, NULL);
}

/* Gradients accumulate (+=) into mt_param_grad, which FSDP provides in f32 during the backward
 * of the layer's unit and then reduce-scatters (averaging over the ranks). */
static mt_status layer_backward(mt_module *m, void *ctx) {
    layer *L = mt_module_user(m);
    pass *p = ctx;
    size_t n = (size_t)p->rows * (size_t)L->out;
    float *d_pre = p->d_pre[L->index], *d_out = p->d_act[L->index + 1];
    switch (L->act) {
    case ACT_TANH:
        MT_TRY(mt_op_tanh_backward(p->dev, p->act[L->index + 1], d_out, d_pre, n));
        break;
    case ACT_SILU:
        MT_TRY(mt_op_silu_backward(p->dev, p->pre[L->index], d_out, d_pre, n));
        break;
    case ACT_NONE:
        d_pre = d_out;
        break;
    }
    /* The first layer's input needs no gradient: d_act[0] is NULL. */
    return mt_op_linear_backward_ex(p->dev, d_pre, p->act[L->index], mt_param_data(L->w),
                                    mt_param_dtype(L->w), p->d_act[L->index],
                                    mt_param_grad(L->w), mt_param_grad(L->b), p->rows, L->in,
                                    L->out);
}

/* ---- the root: runs the layers, owns the loss ------------------------------------------------ */

static mt_status net_forward(mt_module *m, void *ctx) {
    pass *p = ctx;
    for (size_t i = 0; i < mt_module_child_count(m); i++)
        MT_TRY(mt_module_forward(mt_module_child(m, i), p));
    return mt_op_mse_forward(p->dev, p->act[LAYERS], p->y, (size_t)p->rows * OUT, &p->loss);
}

/* The loss is this rank's mean; FSDP averages the gradients over the ranks, so with equal local
 * batches the gradient is the global batch's mean, whatever the rank count. */
static mt_status net_backward(mt_module *m, void *ctx) {
    pass *p = ctx;
    MT_TRY(mt_op_mse_backward(p->dev, p->act[LAYERS], p->y, (size_t)p->rows * OUT, 1.0f,
                              p->d_act[LAYERS]));
    for (size_t k = mt_module_child_count(m); k-- > 0;)
        MT_TRY(mt_module_backward(mt_module_child(m, k), p));
    return MT_OK;
}

/* ---- building and initialising --------------------------------------------------------------- */

/* A value in [-1, 1) for a key: the same on every rank (splitmix64's finaliser). */
static float uniform(uint64_t seed, uint64_t a, uint64_t b) {
    uint64_t h = seed ^ (a * 0x9e3779b97f4a7c15ull) ^ (b * 0xc2b2ae3d27d4eb4full);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    return (float)((double)(h >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

/* Parameters are initialised before sharding, while each is still its own f32 buffer on the
 * device: the same values on every rank (FSDP keeps each rank's shard of them). */
static mt_status init_param(mt_device *dev, mt_param *prm, uint64_t seed, uint64_t tag,
                            float scale) {
    size_t n = mt_param_numel(prm);
    float *host = malloc(n * sizeof *host), *data = mt_param_f32(prm);
    if (!host) return mt_error_set(MT_ERR_OUT_OF_MEMORY, "no host memory to initialise %s",
                                   mt_param_name(prm));
    for (size_t i = 0; i < n; i++) host[i] = scale * uniform(seed, tag, i);
    mt_status st = data ? mt_device_copy(dev, data, host, n * sizeof *host,
                                         MT_COPY_HOST_TO_DEVICE, NULL)
                        : MT_ERR_INVALID_ARG;
    free(host);
    return st;
}

static mt_status add_layer(mt_mesh *mesh, mt_module *net, layer *L, const char *name,
                           uint64_t seed) {
    static const mt_module_ops ops = {.forward = layer_forward, .backward = layer_backward};
    mt_module *m = NULL;
    MT_TRY(mt_module_create(mesh, name, &ops, L, &m));
    const mt_tp_placement replicated = {MT_TP_REPLICATE, 0};
    mt_status st = mt_module_add_param(m, "w", 2, (int64_t[]){L->out, L->in}, replicated, &L->w);
    if (st == MT_OK)
        st = mt_module_add_param(m, "b", 1, (int64_t[]){L->out}, replicated, &L->b);
    mt_device *dev = mt_runtime_device(mt_mesh_runtime(mesh));
    if (st == MT_OK) st = init_param(dev, L->w, seed, 2 * (uint64_t)L->index, 1.0f / sqrtf(L->in));
    if (st == MT_OK) st = init_param(dev, L->b, seed, 2 * (uint64_t)L->index + 1, 0.1f);
    /* Once added, the child belongs to the parent: destroying the root destroys it. */
    if (st == MT_OK) st = mt_module_add_child(net, m);
    if (st != MT_OK) mt_module_destroy(m);
    return st;
}

/* ---- data ------------------------------------------------------------------------------------ */

/* Sample i of the global batch: x uniform, y a fixed smooth function of x. */
static void make_batch(uint64_t seed, int first, int rows, float *x, float *y) {
    for (int r = 0; r < rows; r++) {
        float *xi = x + (size_t)r * IN;
        for (int j = 0; j < IN; j++) xi[j] = uniform(seed + 7, (uint64_t)(first + r), j);
        for (int o = 0; o < OUT; o++)
            y[(size_t)r * OUT + o] = sinf(xi[o] + xi[o + OUT]) * 0.5f + xi[o + 2 * OUT] * xi[o];
    }
}

/* ---- one training step ----------------------------------------------------------------------- */

static void free_pass(pass *p) {
    for (int l = 0; l <= LAYERS; l++) {
        mt_device_free(p->dev, p->act[l]);
        mt_device_free(p->dev, p->d_act[l]);
        if (l < LAYERS) {
            mt_device_free(p->dev, p->pre[l]);
            mt_device_free(p->dev, p->d_pre[l]);
        }
    }
    mt_device_free(p->dev, (void *)p->y);
    mt_device_free(p->dev, p->bias32);
}

static mt_status alloc_zeroed(mt_device *dev, size_t floats, float **out) {
    MT_TRY(mt_device_alloc(dev, floats * sizeof(float), MT_MEM_ACTIVATIONS, (void **)out));
    return mt_device_memset(dev, *out, 0, floats * sizeof(float), NULL);
}

/* Activations live for one pass: allocated here, freed by free_pass (also after an error). */
static mt_status alloc_pass(pass *p, const float *x_host, const float *y_host) {
    const int width[LAYERS + 1] = {IN, HIDDEN, HIDDEN, OUT};
    size_t rows = (size_t)p->rows;
    for (int l = 0; l <= LAYERS; l++) {
        MT_TRY(alloc_zeroed(p->dev, rows * width[l], &p->act[l]));
        if (l > 0) MT_TRY(alloc_zeroed(p->dev, rows * width[l], &p->d_act[l]));
        if (l < LAYERS) {
            MT_TRY(alloc_zeroed(p->dev, rows * width[l + 1], &p->pre[l]));
            MT_TRY(alloc_zeroed(p->dev, rows * width[l + 1], &p->d_pre[l]));
        }
    }
    MT_TRY(alloc_zeroed(p->dev, HIDDEN, &p->bias32));
    float *y = NULL;
    MT_TRY(alloc_zeroed(p->dev, rows * OUT, &y));
    p->y = y;
    MT_TRY(mt_device_copy(p->dev, p->act[0], x_host, rows * IN * sizeof(float),
                          MT_COPY_HOST_TO_DEVICE, NULL));
    return mt_device_copy(p->dev, y, y_host, rows * OUT * sizeof(float), MT_COPY_HOST_TO_DEVICE,
                          NULL);
}

static mt_status train_step(mt_module *net, mt_adamw *adam, mt_group *dp, pass *p,
                            const float *x, const float *y, float *global_loss) {
    mt_status st = alloc_pass(p, x, y);
    if (st == MT_OK) st = mt_module_forward(net, p);
    if (st == MT_OK) st = mt_module_backward(net, p);
    free_pass(p);
    if (st == MT_OK) st = mt_adamw_step(adam);
    if (st == MT_OK) st = mt_zero_grad(net);
    /* Each rank's loss is the mean over its rows; the global batch's is the mean over ranks. */
    *global_loss = p->loss;
    if (st == MT_OK) st = mt_all_reduce(dp, global_loss, global_loss, 1, MT_F32, MT_REDUCE_AVG,
                                        NULL);
    return st;
}

/* ---- main ------------------------------------------------------------------------------------ */

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.steps = 20, .batch = 32, .lr = 1e-2f, .seed = 1, .fail_on_rank = -1,
                   .param_dtype = MT_F32};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "custom_model: %s needs a value\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--steps")) o->steps = atoi(v);
        else if (!strcmp(a, "--batch")) o->batch = atoi(v);
        else if (!strcmp(a, "--lr")) o->lr = strtof(v, NULL);
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--fail-on-rank")) o->fail_on_rank = atoi(v);
        else if (!strcmp(a, "--param-dtype")) {
            if (mt_dtype_parse(v, &o->param_dtype) != MT_OK) {
                fprintf(stderr, "custom_model: --param-dtype %s: use f32 or bf16\n", v);
                return -1;
            }
        } else {
            fprintf(stderr, "custom_model: unknown option %s\n", a);
            return -1;
        }
    }
    if (o->steps < 0 || o->batch < 1) {
        fprintf(stderr, "custom_model: --steps must be >= 0 and --batch >= 1\n");
        return -1;
    }
    return 0;
}

static mt_status run(mt_runtime *rt, const options *o) {
    int rank = mt_runtime_rank(rt), world = mt_runtime_world_size(rt);
    if (o->batch % world != 0)
        return mt_error_set(MT_ERR_INVALID_ARG, "the global batch %d must be a multiple of the "
                            "%d ranks", o->batch, world);
    int rows = o->batch / world;
    mt_mesh *mesh = NULL;
    MT_TRY(mt_mesh_create(rt, 1, (int[]){world}, (const char *[]){"dp"}, &mesh));

    /* The model: every rank builds the same one, with the same initial values. */
    layer layers[LAYERS] = {
        {.index = 0, .in = IN, .out = HIDDEN, .act = ACT_TANH, .fail_on_rank = -1},
        {.index = 1, .in = HIDDEN, .out = HIDDEN, .act = ACT_SILU, .fail_on_rank = o->fail_on_rank},
        {.index = 2, .in = HIDDEN, .out = OUT, .act = ACT_NONE, .fail_on_rank = -1},
    };
    static const char *names[LAYERS] = {"fc1", "fc2", "head"};
    static const mt_module_ops net_ops = {.forward = net_forward, .backward = net_backward};
    mt_module *net = NULL;
    mt_adamw *adam = NULL;
    mt_group *dp = NULL;
    mt_status st = mt_module_create(mesh, "net", &net_ops, NULL, &net);
    for (int l = 0; l < LAYERS && st == MT_OK; l++)
        st = add_layer(mesh, net, &layers[l], names[l], o->seed);

    /* FSDP: each layer a unit, then the root (which owns no parameter of its own here). The
     * optimizer comes after sharding: it holds state for this rank's shards only. */
    mt_fsdp_options fo = mt_fsdp_defaults(mesh, "dp");
    fo.param_dtype = o->param_dtype;
    for (int l = 0; l < LAYERS && st == MT_OK; l++)
        st = mt_fsdp_shard(mt_module_child(net, (size_t)l), &fo);
    if (st == MT_OK) st = mt_fsdp_shard(net, &fo);
    if (st == MT_OK) st = mt_adamw_create(net, &(mt_adamw_options){.lr = o->lr}, &adam);
    if (st == MT_OK) st = mt_mesh_group(mesh, "dp", &dp);
    if (st == MT_OK && rank == 0)
        printf("custom_model: 3 layers (%d -> %d -> %d -> %d), %d rank(s), global batch %d, "
               "params in %s\n", IN, HIDDEN, HIDDEN, OUT, world, o->batch,
               mt_dtype_name(o->param_dtype));

    float *x = malloc((size_t)rows * IN * sizeof *x), *y = malloc((size_t)rows * OUT * sizeof *y);
    if (st == MT_OK && (!x || !y))
        st = mt_error_set(MT_ERR_OUT_OF_MEMORY, "no host memory for %d rows", rows);
    for (int step = 0; step < o->steps && st == MT_OK; step++) {
        /* The same global batch every step, this rank's rows of it: a loss that falls shows
         * that the model learns; one that agrees across rank counts shows FSDP is exact. */
        make_batch(o->seed, rank * rows, rows, x, y);
        pass p = {.dev = mt_runtime_device(rt), .rank = rank, .rows = rows};
        float loss = 0.0f;
        st = train_step(net, adam, dp, &p, x, y, &loss);
        if (st == MT_OK && rank == 0) printf("step %d loss %.6f\n", step, (double)loss);
    }
    free(x);
    free(y);
    mt_adamw_destroy(adam);
    mt_module_destroy(net); /* and its layers */
    mt_mesh_destroy(mesh);
    return st;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o) != 0) return 2;
    mt_runtime *rt = NULL;
    mt_status st = mt_init(&rt, &argc, &argv);
    if (st == MT_OK) st = run(rt, &o);
    /* On an error this rank cannot recover from: say it, then end the job. mt_abort tells the
     * other ranks (their waits stop within a second with this message) and exits with st. */
    if (st != MT_OK) {
        fprintf(stderr, "custom_model: %s\n", mt_last_error());
        mt_abort(rt, st);
    }
    mt_finalize(rt);
    return 0;
}
