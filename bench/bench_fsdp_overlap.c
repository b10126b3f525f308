/* mt-bench-fsdp-overlap: how much of FSDP's communication the prefetch schedule hides.
 *
 *   mtrun --nproc_per_node N mt-bench-fsdp-overlap [--layers 8] [--width 1024] [--batch 16]
 *         [--rounds 10]
 *
 * Four times are taken per round, one after the other, on every rank at once (so that ranks
 * share the cores exactly as in training), each the slowest rank's and each ending when the
 * device is idle:
 *   compute  the MLP's forward and backward ops (same shapes, same per-rank batch) on the
 *            rank's own device buffers, no engine and no communication;
 *   comm     the collectives of one step without compute: per unit an all-gather in forward,
 *            an all-gather and a reduce-scatter in backward, each waited for before the next,
 *            each into a freshly allocated full buffer as the engine does;
 *   off/on   mt_mlp_forward_backward through the engine with prefetch off / on.
 * Rank 0 prints the medians over --rounds and the hidden fraction of communication,
 *   hidden = 1 - (step - compute) / comm,
 * i.e. the share of the communication time that does not add to the step. Rounds interleave
 * the four so that a slow moment of the machine hits all of them.
 */
#include "bench/bench_fsdp_mlp.h"
#include "core/error.h"
#include "fsdp/fsdp_shards.h"
#include "models/mlp_internal.h"

#include <meshtrain/meshtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROG "mt-bench-fsdp-overlap"

typedef struct options {
    int layers, width, batch, rounds;
} options;

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.layers = 8, .width = 1024, .batch = 16, .rounds = 10};
    for (int i = 1; i < argc; i++) {
        int *dst = !strcmp(argv[i], "--layers") ? &o->layers
                   : !strcmp(argv[i], "--width") ? &o->width
                   : !strcmp(argv[i], "--batch") ? &o->batch
                   : !strcmp(argv[i], "--rounds") ? &o->rounds
                                                  : NULL;
        if (!dst || i + 1 >= argc || (*dst = atoi(argv[++i])) < 1) {
            fprintf(stderr, PROG ": bad option %s (--layers, --width, --batch, "
                            "--rounds take an integer >= 1)\n", argv[i]);
            return -1;
        }
    }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Local buffers for the compute-only pass, in device memory as the engine's are (the ops take
 * device pointers): every layer is width x width here, so one weight serves all layers (the cost
 * of a product does not depend on the values). */
typedef struct compute_bufs {
    float *w, *b, *dw, *db;
    float **acts; /* layers + 1 activations of batch x width */
    float *d, *d_next, *target;
} compute_bufs;

static void compute_bufs_free(mt_device *dev, const options *o, compute_bufs *c) {
    if (c->acts)
        for (int l = 0; l <= o->layers; l++) mt_device_free(dev, c->acts[l]);
    free(c->acts);
    float *bufs[] = {c->w, c->b, c->dw, c->db, c->d, c->d_next, c->target};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) mt_device_free(dev, bufs[i]);
}

/* A zeroed device buffer of elems floats. */
static mt_status device_zeros(mt_device *dev, size_t elems, float **out) {
    MT_TRY(mt_device_alloc(dev, elems * sizeof(float), MT_MEM_ACTIVATIONS, (void **)out));
    return mt_device_memset(dev, *out, 0, elems * sizeof(float), NULL);
}

/* Allocates the buffers; the input and target are this rank's batch x, y (host memory). */
static mt_status compute_bufs_init(mt_device *dev, const options *o, const float *x,
                                   const float *y, compute_bufs *c) {
    size_t bw = (size_t)o->batch * o->width, ww = (size_t)o->width * o->width;
    c->acts = calloc((size_t)o->layers + 1, sizeof *c->acts);
    if (!c->acts)
        return mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": out of host memory for %d activations",
                        o->layers + 1);
    for (int l = 0; l <= o->layers; l++) MT_TRY(device_zeros(dev, bw, &c->acts[l]));
    MT_TRY(device_zeros(dev, ww, &c->w));
    MT_TRY(device_zeros(dev, ww, &c->dw));
    MT_TRY(device_zeros(dev, (size_t)o->width, &c->b));
    MT_TRY(device_zeros(dev, (size_t)o->width, &c->db));
    MT_TRY(device_zeros(dev, bw, &c->d));
    MT_TRY(device_zeros(dev, bw, &c->d_next));
    MT_TRY(device_zeros(dev, bw, &c->target));
    float *w = malloc(ww * sizeof *w);
    if (!w)
        return mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": out of host memory for a %d x %d weight",
                        o->width, o->width);
    for (size_t i = 0; i < ww; i++) w[i] = (float)((i * 2654435761u) % 1000) * 1e-6f - 5e-4f;
    mt_status st = mt_device_copy(dev, c->w, w, ww * sizeof *w, MT_COPY_HOST_TO_DEVICE, NULL);
    free(w);
    MT_TRY(st);
    MT_TRY(mt_device_copy(dev, c->acts[0], x, bw * sizeof *x, MT_COPY_HOST_TO_DEVICE, NULL));
    return mt_device_copy(dev, c->target, y, bw * sizeof *y, MT_COPY_HOST_TO_DEVICE, NULL);
}

static mt_status compute_pass(mt_device *dev, const options *o, compute_bufs *c) {
    int bw = o->batch * o->width;
    size_t bytes = (size_t)bw * sizeof(float);
    for (int l = 0; l < o->layers; l++) {
        MT_TRY(mt_op_linear_forward(dev, c->acts[l], c->w, c->b, c->acts[l + 1], o->batch,
                                    o->width, o->width));
        if (l < o->layers - 1)
            MT_TRY(mt_op_relu_forward(dev, c->acts[l + 1], c->acts[l + 1], (size_t)bw));
    }
    float loss;
    MT_TRY(mt_op_mse_forward(dev, c->acts[o->layers], c->target, (size_t)bw, &loss));
    MT_TRY(mt_device_memset(dev, c->d, 0, bytes, NULL));
    MT_TRY(mt_op_mse_backward(dev, c->acts[o->layers], c->target, (size_t)bw, 1.0f, c->d));
    for (int l = o->layers - 1; l >= 0; l--) {
        if (l < o->layers - 1) {
            MT_TRY(mt_device_memset(dev, c->d_next, 0, bytes, NULL));
            MT_TRY(mt_op_relu_backward(dev, c->acts[l + 1], c->d, c->d_next, (size_t)bw));
            float *t = c->d;
            c->d = c->d_next;
            c->d_next = t;
        }
        MT_TRY(mt_device_memset(dev, c->d_next, 0, bytes, NULL));
        MT_TRY(mt_op_linear_backward(dev, c->d, c->acts[l], c->w, l > 0 ? c->d_next : NULL, c->dw,
                                     c->db, o->batch, o->width, o->width));
        float *t = c->d;
        c->d = c->d_next;
        c->d_next = t;
    }
    return MT_OK;
}

/* The collectives of one step, one at a time, with the engine's buffer life cycle: a fresh
 * full-parameter buffer per all-gather and a fresh, zeroed full-gradient buffer per
 * reduce-scatter, from the device, freed afterwards (what a step pays besides compute). */
static mt_status gather(mt_device *dev, mt_group *dp, float *shard, size_t n) {
    void *full = NULL;
    MT_TRY(mt_device_alloc(dev, n * (size_t)mt_group_size(dp) * sizeof(float), MT_MEM_PARAMS,
                           &full));
    mt_status st = mt_all_gather(dp, shard, full, n, MT_F32, NULL);
    mt_device_free(dev, full);
    return st;
}

static mt_status reduce(mt_device *dev, mt_group *dp, float *shard, size_t n) {
    size_t bytes = n * (size_t)mt_group_size(dp) * sizeof(float);
    void *full = NULL;
    MT_TRY(mt_device_alloc(dev, bytes, MT_MEM_GRADS, &full));
    mt_status st = mt_device_memset(dev, full, 0, bytes, NULL);
    if (st == MT_OK) st = mt_reduce_scatter(dp, full, shard, n, MT_F32, MT_REDUCE_AVG, NULL);
    mt_device_free(dev, full);
    return st;
}

static mt_status comm_pass(mt_device *dev, mt_group *dp, const size_t *unit_n, int n_units,
                           float *shard) {
    for (int u = 0; u < n_units; u++)
        if (unit_n[u]) MT_TRY(gather(dev, dp, shard, unit_n[u]));
    for (int u = n_units - 1; u >= 0; u--) {
        if (!unit_n[u]) continue;
        MT_TRY(gather(dev, dp, shard, unit_n[u]));
        MT_TRY(reduce(dev, dp, shard, unit_n[u]));
    }
    return MT_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { T_COMPUTE, T_COMM, T_OFF, T_ON, T_COUNT };

static mt_status run(mt_runtime *rt, const options *o) {
    int rank = mt_runtime_rank(rt), world = mt_runtime_world_size(rt);
    mt_device *dev = mt_runtime_device(rt);
    mt_group *wg = mt_runtime_world(rt);
    mt_bench_mlp b;
    mt_status st = mt_bench_mlp_create(rt, PROG, o->layers, o->width, o->batch, &b);
    mt_group *dp = NULL;
    if (st == MT_OK) st = mt_mesh_group(b.mesh, "dp", &dp);
    mt_mlp *mlp = b.mlp;
    float *x = b.x, *y = b.y;
    mt_module *root = mt_mlp_root(mlp);

    /* The units' shard sizes, for the communication-only pass. */
    mt_fsdp_shard_view *views = NULL;
    size_t n_views = 0, max_n = 0;
    if (st == MT_OK) st = mt_fsdp_collect_shards(root, &views, &n_views);
    size_t *unit_n = calloc(n_views + 1, sizeof *unit_n);
    if (st == MT_OK && !unit_n)
        st = mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": out of host memory for %zu unit sizes",
                      n_views);
    for (size_t u = 0; u < n_views && unit_n; u++) {
        unit_n[u] = views[u].n;
        if (views[u].n > max_n) max_n = views[u].n;
    }
    free(views);
    /* The shard the collectives send and receive: device memory, as the engine's shards are
     * (on a GPU the collectives then take NCCL, as in a step). */
    float *shard = NULL;
    if (st == MT_OK) st = device_zeros(dev, max_n + 1, &shard);

    compute_bufs c = {0};
    if (st == MT_OK) {
        mt_mlp_synthetic_batch(&b.cfg, 7, 0, (long)rank * o->batch, o->batch, x, y);
        st = compute_bufs_init(dev, o, x, y, &c);
    }

    /* Warm-up: the first step records the schedule; a second one with each setting. */
    for (int w = 0; w < 3 && st == MT_OK; w++) {
        st = mt_fsdp_set_prefetch(root, w != 1);
        if (st == MT_OK) st = mt_mlp_forward_backward(mlp, x, y, o->batch, 1.0f, NULL);
        if (st == MT_OK) st = mt_zero_grad(root);
    }

    double *times = calloc((size_t)o->rounds * T_COUNT, sizeof *times);
    if (st == MT_OK && !times)
        st = mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": out of host memory for %d rounds of times",
                      o->rounds);
    for (int r = 0; r < o->rounds && st == MT_OK; r++) {
        for (int k = 0; k < T_COUNT && st == MT_OK; k++) {
            if (k == T_OFF || k == T_ON) st = mt_fsdp_set_prefetch(root, k == T_ON);
            if (st == MT_OK) st = mt_barrier(wg, NULL);
            double t0 = now_s();
            if (st == MT_OK) {
                if (k == T_COMPUTE) st = compute_pass(dev, o, &c);
                else if (k == T_COMM) st = comm_pass(dev, dp, unit_n, (int)n_views, shard);
                else st = mt_mlp_forward_backward(mlp, x, y, o->batch, 1.0f, NULL);
            }
            /* A GPU may still run queued ops: the time ends when the device is idle. */
            if (st == MT_OK) st = mt_device_synchronize(dev);
            float dt = (float)(now_s() - t0);
            if (st == MT_OK) st = mt_all_reduce(wg, &dt, &dt, 1, MT_F32, MT_REDUCE_MAX, NULL);
            if (st == MT_OK && (k == T_OFF || k == T_ON)) st = mt_zero_grad(root);
            times[(size_t)k * o->rounds + r] = dt;
        }
    }

    if (st == MT_OK && rank == 0) {
        double med[T_COUNT];
        for (int k = 0; k < T_COUNT; k++) {
            double *t = times + (size_t)k * o->rounds;
            qsort(t, (size_t)o->rounds, sizeof *t, cmp_double);
            med[k] = t[o->rounds / 2] * 1e3;
        }
        printf("ranks %d, %d layers of %d x %d (%zu parameters), batch %d per rank, median of %d "
               "rounds (ms, slowest rank)\n",
               world, o->layers, o->width, o->width, mt_mlp_param_count(mlp), o->batch, o->rounds);
        printf("  compute only        %9.2f\n", med[T_COMPUTE]);
        printf("  communication only  %9.2f\n", med[T_COMM]);
        printf("  step, prefetch off  %9.2f   hidden %5.1f%%\n", med[T_OFF],
               100.0 * (1.0 - (med[T_OFF] - med[T_COMPUTE]) / med[T_COMM]));
        printf("  step, prefetch on   %9.2f   hidden %5.1f%%\n", med[T_ON],
               100.0 * (1.0 - (med[T_ON] - med[T_COMPUTE]) / med[T_COMM]));
    }

    free(times);
    compute_bufs_free(dev, o, &c);
    mt_device_free(dev, shard);
    free(unit_n);
    mt_bench_mlp_destroy(&b);
    return st;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o) != 0) return 2;
    mt_runtime *rt = NULL;
    mt_status st = mt_init(&rt, &argc, &argv);
    if (st == MT_OK) st = run(rt, &o);
    if (st != MT_OK) fprintf(stderr, PROG ": %s\n", mt_last_error());
    if (rt) mt_finalize(rt);
    return st == MT_OK ? 0 : 1;
}
