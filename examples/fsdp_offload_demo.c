/* Why offload: a model whose training state does not fit one device trains on that device once
 * its shards live in the host memory tier (docs/offload.md).
 *
 *   MT_CPU_DEVICE_MEMORY=48MiB mtrun --standalone --nproc_per_node 1 fsdp_offload_demo \
 *       --offload none    # refused: out of memory on cpu ... for <category>
 *   MT_CPU_DEVICE_MEMORY=48MiB mtrun --standalone --nproc_per_node 1 fsdp_offload_demo \
 *       --offload full    # trains; the host tier holds the shards and AdamW state
 *
 * The default MLP (8 linear layers of 1024 x 1024, 8.4 M parameters) needs 16 bytes per
 * parameter with f32 AdamW (parameter, gradient, two moments): 128 MiB, which a 48 MiB device
 * cannot hold. With --offload full the device holds only the layers in flight (a gathered layer
 * is 4 MiB, its full gradient 4 MiB, and the next layer's prefetch), the host tier the rest.
 * At the end rank 0 prints the device's peak and capacity (mt_device_mem_stats) and what the host
 * tier held (mt_host_mem_stats), as one "accounting:" line of byte counts for scripts.
 *
 * options: --offload none|optimizer|full (full) --offload-ratio R (1, passed to the engine
 * unchecked, so that its own error shows) --root-offload none|optimizer|full (the root unit's
 * policy, --offload's by default: layers offloaded under a resident root is a valid setup)
 * --layers L --width W --batch B --steps S --lr LR. Losses print with 9 significant digits,
 * which identify a float exactly, so that runs can be compared bit for bit.
 */

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct demo {
    mt_runtime *rt;
    mt_mesh *mesh;
    mt_mlp *mlp;
    mt_adamw *opt;
    float *x, *y;
} demo;

typedef struct args {
    mt_mlp_config cfg;
    int batch, steps;
    float lr;
    mt_fsdp_options fsdp; /* offload and offload_ratio; the rest is filled in with the mesh */
    mt_offload root_offload; /* the root unit's policy */
} args;

static int failed(int rank, const char *what) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, mt_last_error());
    return 1;
}

static const char *policy(mt_offload p) {
    return p == MT_OFFLOAD_FULL ? "full" : p == MT_OFFLOAD_OPTIMIZER ? "optimizer" : "none";
}

/* Every layer a unit, then the root, initialised once sharded; AdamW on the shards. */
static int shard(demo *d, const args *a, int rank) {
    mt_fsdp_options o = mt_fsdp_defaults(d->mesh, "dp");
    o.offload = a->fsdp.offload;
    o.offload_ratio = a->fsdp.offload_ratio;
    for (int l = 0; l < a->cfg.layers; l++)
        if (mt_fsdp_shard(mt_mlp_layer(d->mlp, l), &o) != MT_OK)
            return failed(rank, "sharding a layer");
    o.offload = a->root_offload;
    if (mt_fsdp_shard(mt_mlp_root(d->mlp), &o) != MT_OK) return failed(rank, "sharding the root");
    /* Deferred parameters get their values here, shard by shard, where the shards are: the
     * whole model is never on the device. */
    if (mt_module_init_params(mt_mlp_root(d->mlp)) != MT_OK)
        return failed(rank, "initialising the shards");
    if (mt_adamw_create(mt_mlp_root(d->mlp), &(mt_adamw_options){.lr = a->lr}, &d->opt) != MT_OK)
        return failed(rank, "creating AdamW");
    return 0;
}

/* A fixed batch per rank (a falling loss shows training works): waves in, a saturated copy out. */
static int make_batch(demo *d, const args *a, int rank) {
    int in = a->cfg.in_dim, out = a->cfg.out_dim;
    d->x = malloc((size_t)a->batch * (size_t)in * sizeof(float));
    d->y = malloc((size_t)a->batch * (size_t)out * sizeof(float));
    if (!d->x || !d->y) {
        fprintf(stderr, "rank %d: no host memory for the batch\n", rank);
        return 1;
    }
    for (int i = 0; i < a->batch; i++) {
        float sample = (float)((long)rank * a->batch + i);
        for (int j = 0; j < in; j++) d->x[(size_t)i * in + j] = sinf(0.05f * j + 0.7f * sample);
        for (int k = 0; k < out; k++)
            d->y[(size_t)i * out + k] = tanhf(2.0f * d->x[(size_t)i * in + k % in]);
    }
    return 0;
}

/* Rank 0: the device's peak against its capacity and the host tier's share, from the
 * accounting. */
static void report(demo *d) {
    mt_mem_stats dev, host;
    mt_device_mem_stats(mt_runtime_device(d->rt), &dev);
    mt_host_mem_stats(mt_runtime_device(d->rt), &host);
    char a[32], b[32], c[32];
    printf("device peak %s of capacity %s; host tier peak %s\n",
           mt_format_bytes(dev.total_peak, a, sizeof a),
           dev.capacity ? mt_format_bytes(dev.capacity, b, sizeof b) : "unlimited",
           mt_format_bytes(host.total_peak, c, sizeof c));
    printf("accounting: device_peak=%zu device_capacity=%zu host_peak=%zu", dev.total_peak,
           dev.capacity, host.total_peak);
    for (int k = 0; k < MT_MEM_CATEGORY_COUNT; k++)
        printf(" host_%s=%zu", mt_mem_category_name((mt_mem_category)k), host.peak[k]);
    printf("\n");
    char text[2048];
    printf("rank 0 memory:\n%s\n", mt_memory_report(mt_runtime_device(d->rt), text, sizeof text));
}

static int run(demo *d, const args *a) {
    if (mt_init(&d->rt, NULL, NULL) != MT_OK) return failed(-1, "mt_init");
    int rank = mt_runtime_rank(d->rt), world = mt_runtime_world_size(d->rt);
    const char *dp = "dp";
    if (mt_mesh_create(d->rt, 1, &world, &dp, &d->mesh) != MT_OK)
        return failed(rank, "creating the mesh");
    if (mt_mlp_create(d->mesh, &a->cfg, &d->mlp) != MT_OK) return failed(rank, "creating the MLP");
    size_t params = mt_mlp_param_count(d->mlp);
    if (rank == 0) {
        char full[32];
        printf("MLP: %d layers of width %d, %zu parameters; training state (16 bytes each) %s "
               "on %d rank(s); offload %s (ratio %g)\n", a->cfg.layers, a->cfg.width, params,
               mt_format_bytes(16 * params, full, sizeof full), world,
               policy(a->fsdp.offload), (double)a->fsdp.offload_ratio);
    }
    if (shard(d, a, rank) || make_batch(d, a, rank)) return 1;
    for (int s = 0; s < a->steps; s++) {
        float loss = 0, sum = 0;
        if (mt_mlp_forward_backward(d->mlp, d->x, d->y, a->batch, 1.0f, &loss) != MT_OK)
            return failed(rank, "forward/backward");
        if (mt_adamw_step(d->opt) != MT_OK) return failed(rank, "the optimizer step");
        if (mt_zero_grad(mt_mlp_root(d->mlp)) != MT_OK) return failed(rank, "zeroing gradients");
        if (mt_all_reduce(mt_runtime_world(d->rt), &loss, &sum, 1, MT_F32, MT_REDUCE_AVG, NULL) !=
            MT_OK)
            return failed(rank, "averaging the loss");
        if (rank == 0) printf("step %d loss %.9g\n", s, (double)sum);
    }
    if (rank == 0) report(d);
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: fsdp_offload_demo [--offload none|optimizer|full] [--offload-ratio R] "
                    "[--root-offload none|optimizer|full] [--layers L] [--width W] [--batch B] "
                    "[--steps S] [--lr LR] (positive)\n");
    return 2;
}

static int parse_policy(const char *v, mt_offload *out) {
    if (strcmp(v, "none") == 0) *out = MT_OFFLOAD_NONE;
    else if (strcmp(v, "optimizer") == 0) *out = MT_OFFLOAD_OPTIMIZER;
    else if (strcmp(v, "full") == 0) *out = MT_OFFLOAD_FULL;
    else return usage();
    return 0;
}

/* The whole value is a number: strtof alone turned "abc" into 0 (and "1x" into 1). The range is
 * left to the caller (the engine checks the ratio itself, so that its error shows). */
static int parse_float(const char *name, const char *v, float *out) {
    char *end = NULL;
    float f = strtof(v, &end);
    if (end == v || *end != '\0') {
        fprintf(stderr, "fsdp_offload_demo: %s '%s' is not a number\n", name, v);
        return 2;
    }
    *out = f;
    return 0;
}

static int parse(int argc, char **argv, args *a) {
    *a = (args){.cfg = {.layers = 8, .in_dim = 1024, .width = 1024, .out_dim = 1024, .seed = 1,
                        .defer_init = true},
                .batch = 8, .steps = 5, .lr = 3e-4f};
    a->fsdp.offload = MT_OFFLOAD_FULL;
    a->fsdp.offload_ratio = 1.0f;
    bool root_given = false;
    for (int i = 1; i < argc; i += 2) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        if (strcmp(argv[i], "--offload") == 0) {
            if (parse_policy(v, &a->fsdp.offload)) return 2;
        } else if (strcmp(argv[i], "--root-offload") == 0) {
            if (parse_policy(v, &a->root_offload)) return 2;
            root_given = true;
        } else if (strcmp(argv[i], "--offload-ratio") == 0) {
            if (parse_float(argv[i], v, &a->fsdp.offload_ratio)) return 2;
        } else if (strcmp(argv[i], "--layers") == 0) a->cfg.layers = atoi(v);
        else if (strcmp(argv[i], "--width") == 0)
            a->cfg.width = a->cfg.in_dim = a->cfg.out_dim = atoi(v);
        else if (strcmp(argv[i], "--batch") == 0) a->batch = atoi(v);
        else if (strcmp(argv[i], "--steps") == 0) a->steps = atoi(v);
        else if (strcmp(argv[i], "--lr") == 0) {
            if (parse_float(argv[i], v, &a->lr)) return 2;
        } else return usage();
    }
    if (!root_given) a->root_offload = a->fsdp.offload;
    if (a->cfg.layers < 1 || a->cfg.width < 1 || a->batch < 1 || a->steps < 1 || !(a->lr > 0))
        return usage();
    return 0;
}

int main(int argc, char **argv) {
    args a;
    if (parse(argc, argv, &a)) return 2;
    demo d = {0};
    int rc = run(&d, &a);
    free(d.x);
    free(d.y);
    if (d.opt) mt_adamw_destroy(d.opt);
    if (d.mlp) mt_mlp_destroy(d.mlp);
    if (d.mesh) mt_mesh_destroy(d.mesh);
    if (d.rt) mt_finalize(d.rt);
    return rc;
}
