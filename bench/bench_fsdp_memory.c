/* mt-bench-fsdp-memory: per-rank peak model state of FSDP training against the theory.
 *
 *   mtrun --nproc_per_node N mt-bench-fsdp-memory [--layers 8] [--width 1024] [--batch 16]
 *         [--steps 3] [--no-header]
 *
 * The reference MLP (every layer width x width, one FSDP unit per layer, then the root) trains
 * for --steps steps of --batch samples per rank with f32 parameters and AdamW. After setup the
 * device peaks are reset; the measured model state is the sum of the peaks of the params, grads
 * and optimizer categories (an upper bound of their simultaneous peak). The theory is
 *
 *   16 bytes x (each unit's shard, padding included) + the unsharded units in flight:
 *   2 x full params (the unit computing and the unit prefetched) and 2 x full grads (the unit in
 *   backward and the unit whose reduce-scatter is outstanding), of the two largest units.
 *
 * Rank 0 prints one row: the worst rank's ratio measured / theory (target <= 1.10).
 * bench/fsdp_memory.sh runs N = 1, 2, 4, 8 and prints one table.
 */
#include "bench/bench_fsdp_mlp.h"
#include "core/error.h"
#include "fsdp/fsdp_shards.h"
#include "models/mlp_internal.h"

#include <meshtrain/meshtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "mt-bench-fsdp-memory"

typedef struct options {
    int layers, width, batch, steps, header;
} options;

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.layers = 8, .width = 1024, .batch = 16, .steps = 3, .header = 1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-header")) {
            o->header = 0;
            continue;
        }
        int *dst = !strcmp(argv[i], "--layers") ? &o->layers
                   : !strcmp(argv[i], "--width") ? &o->width
                   : !strcmp(argv[i], "--batch") ? &o->batch
                   : !strcmp(argv[i], "--steps") ? &o->steps
                                                 : NULL;
        if (!dst || i + 1 >= argc || (*dst = atoi(argv[++i])) < 1) {
            fprintf(stderr, PROG ": bad option %s (--layers, --width, --batch, "
                            "--steps take an integer >= 1; --no-header)\n", argv[i]);
            return -1;
        }
    }
    return 0;
}

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

/* Theory for this rank from the engine's own shard sizes (padding included). */
static mt_status theory_bytes(mt_module *root, int world, double *out, double *in_flight) {
    mt_fsdp_shard_view *views = NULL;
    size_t n = 0;
    MT_TRY(mt_fsdp_collect_shards(root, &views, &n));
    double shards = 0.0, big1 = 0.0, big2 = 0.0;
    for (size_t u = 0; u < n; u++) {
        double full = (double)views[u].n * world; /* the unit's padded flat buffer */
        shards += (double)views[u].n;
        if (full > big1) {
            big2 = big1;
            big1 = full;
        } else if (full > big2) {
            big2 = full;
        }
    }
    free(views);
    *in_flight = 2.0 * 4.0 * (big1 + big2); /* params and grads of the two largest units */
    *out = 16.0 * shards + *in_flight;
    return MT_OK;
}

static mt_status run(mt_runtime *rt, const options *o) {
    int rank = mt_runtime_rank(rt), world = mt_runtime_world_size(rt);
    mt_device *dev = mt_runtime_device(rt);
    mt_bench_mlp b;
    mt_adamw *adam = NULL;
    mt_status st = mt_bench_mlp_create(rt, PROG, o->layers, o->width, o->batch, &b);
    mt_mlp *mlp = b.mlp;
    mt_module *root = mt_mlp_root(mlp);
    if (st == MT_OK) st = mt_adamw_create(root, &(mt_adamw_options){.lr = 1e-4f}, &adam);
    double theory = 0.0, in_flight = 0.0;
    if (st == MT_OK) st = theory_bytes(root, world, &theory, &in_flight);

    /* Setup held the unsharded model once; from here only training counts. */
    mt_device_reset_peaks(dev);
    for (int s = 0; s < o->steps && st == MT_OK; s++) {
        mt_mlp_synthetic_batch(&b.cfg, 7, s, (long)rank * o->batch, o->batch, b.x, b.y);
        st = mt_mlp_forward_backward(mlp, b.x, b.y, o->batch, 1.0f, NULL);
        if (st == MT_OK) st = mt_clip_grad_norm(root, 1.0f, NULL);
        if (st == MT_OK) st = mt_adamw_step(adam);
        if (st == MT_OK) st = mt_zero_grad(root);
    }

    mt_mem_stats ms;
    mt_device_mem_stats(dev, &ms);
    float mine[4] = {(float)ms.peak[MT_MEM_PARAMS], (float)ms.peak[MT_MEM_GRADS],
                     (float)ms.peak[MT_MEM_OPTIMIZER], (float)theory};
    float *all = calloc((size_t)world * 4, sizeof *all);
    if (st == MT_OK && !all)
        st = mt_error(MT_ERR_OUT_OF_MEMORY, PROG ": out of host memory for %d ranks' peaks",
                      world);
    if (st == MT_OK)
        st = mt_all_gather(mt_runtime_world(rt), mine, all, 4, MT_F32, NULL);
    if (st == MT_OK && rank == 0) {
        int worst = 0;
        double worst_ratio = 0.0;
        for (int r = 0; r < world; r++) {
            const float *v = all + 4 * r;
            double ratio = ((double)v[0] + v[1] + v[2]) / v[3];
            if (ratio > worst_ratio) {
                worst_ratio = ratio;
                worst = r;
            }
        }
        const float *v = all + 4 * worst;
        size_t params = mt_mlp_param_count(mlp);
        if (o->header)
            printf("%5s %10s %12s %12s %12s %12s %12s %12s %12s %7s\n", "ranks", "params",
                   "16P/N MiB", "in-flight", "theory", "measured", "params pk", "grads pk",
                   "optim pk", "ratio");
        printf("%5d %10zu %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f %7.3f\n", world,
               params, mib(16.0 * params / world), mib(in_flight), mib(v[3]),
               mib((double)v[0] + v[1] + v[2]), mib(v[0]), mib(v[1]), mib(v[2]), worst_ratio);
    }
    free(all);
    mt_adamw_destroy(adam);
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
