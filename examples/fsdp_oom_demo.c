/* Why FSDP: a model whose training state does not fit one device trains once it is sharded.
 *
 *   MT_CPU_DEVICE_MEMORY=80MiB mtrun --standalone --nproc_per_node 1 fsdp_oom_demo   # fails
 *   MT_CPU_DEVICE_MEMORY=80MiB mtrun --standalone --nproc_per_node 4 fsdp_oom_demo   # trains
 *
 * The default MLP (8 linear layers of 1024 x 1024, 8.4 M parameters) needs 16 bytes per
 * parameter with f32 AdamW: 4 for the parameter, 4 for its gradient, 8 for the two moments,
 * 128 MiB in all, which an 80 MiB device cannot hold: the one-rank run stops with
 * "out of memory on cpu: asked ... for <category>, ... left of 80.00 MiB". Sharded over 4 ranks
 * each rank holds a quarter of that state (32 MiB) plus the one or two layers gathered at a time
 * (4 MiB each, and their full gradients), and trains.
 *
 * options: --layers L --width W --batch B (samples per rank and step) --steps S --lr LR
 */

#include <meshtrain/meshtrain.h>

#include <math.h>
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

static int failed(int rank, const char *what) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, mt_last_error());
    return 1;
}

static int run(demo *d, mt_mlp_config cfg, int batch, int steps, float lr) {
    if (mt_init(&d->rt, NULL, NULL) != MT_OK) return failed(-1, "mt_init");
    int rank = mt_runtime_rank(d->rt), world = mt_runtime_world_size(d->rt);
    const char *dp = "dp";
    if (mt_mesh_create(d->rt, 1, &world, &dp, &d->mesh) != MT_OK)
        return failed(rank, "creating the mesh");

    mt_mem_stats mem;
    mt_device_mem_stats(mt_runtime_device(d->rt), &mem);
    if (mt_mlp_create(d->mesh, &cfg, &d->mlp) != MT_OK) return failed(rank, "creating the MLP");
    size_t params = mt_mlp_param_count(d->mlp);
    if (rank == 0) {
        char full[32], share[32], cap[32];
        printf("MLP: %d layers of width %d, %zu parameters; training state (16 bytes each) %s, "
               "%s per rank on %d rank(s); device capacity %s\n",
               cfg.layers, cfg.width, params, mt_format_bytes(16 * params, full, sizeof full),
               mt_format_bytes(16 * params / (size_t)world, share, sizeof share), world,
               mem.capacity ? mt_format_bytes(mem.capacity, cap, sizeof cap) : "unlimited");
    }

    /* Each layer its own unit, then the root: only a layer or two is ever unsharded. */
    mt_fsdp_options o = mt_fsdp_defaults(d->mesh, "dp");
    for (int l = 0; l < cfg.layers; l++)
        if (mt_fsdp_shard(mt_mlp_layer(d->mlp, l), &o) != MT_OK)
            return failed(rank, "sharding a layer");
    if (mt_fsdp_shard(mt_mlp_root(d->mlp), &o) != MT_OK) return failed(rank, "sharding the root");
    if (mt_adamw_create(mt_mlp_root(d->mlp), &(mt_adamw_options){.lr = lr}, &d->opt) != MT_OK)
        return failed(rank, "creating AdamW");

    d->x = malloc((size_t)batch * (size_t)cfg.in_dim * sizeof(float));
    d->y = malloc((size_t)batch * (size_t)cfg.out_dim * sizeof(float));
    if (!d->x || !d->y) {
        fprintf(stderr, "rank %d: no host memory for the batch\n", rank);
        return 1;
    }
    /* Rank r takes samples [r B, (r+1) B) of the global batch. The same batch every step: a
     * million-weight layer fits a fixed batch quickly, and a falling loss is what shows that
     * training works. Smooth waves in, a saturated copy of them out. */
    for (int i = 0; i < batch; i++) {
        long sample = (long)rank * batch + i;
        for (int j = 0; j < cfg.in_dim; j++)
            d->x[(size_t)i * cfg.in_dim + j] = sinf(0.05f * (float)j + 0.7f * (float)sample);
        for (int k = 0; k < cfg.out_dim; k++)
            d->y[(size_t)i * cfg.out_dim + k] =
                tanhf(2.0f * d->x[(size_t)i * cfg.in_dim + k % cfg.in_dim]);
    }
    for (int s = 0; s < steps; s++) {
        float loss = 0, sum = 0;
        if (mt_mlp_forward_backward(d->mlp, d->x, d->y, batch, 1.0f, &loss) != MT_OK)
            return failed(rank, "forward/backward");
        if (mt_adamw_step(d->opt) != MT_OK) return failed(rank, "the optimizer step");
        if (mt_zero_grad(mt_mlp_root(d->mlp)) != MT_OK) return failed(rank, "zeroing gradients");
        if (mt_all_reduce(mt_runtime_world(d->rt), &loss, &sum, 1, MT_F32, MT_REDUCE_AVG, NULL) !=
            MT_OK)
            return failed(rank, "averaging the loss");
        if (rank == 0) printf("step %d loss %.6f\n", s, sum);
    }
    char report[1024];
    if (rank == 0)
        printf("rank 0 memory:\n%s\n",
               mt_memory_report(mt_runtime_device(d->rt), report, sizeof report));
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: fsdp_oom_demo [--layers L] [--width W] [--batch B] [--steps S] "
                    "[--lr LR] (all positive)\n");
    return 2;
}

int main(int argc, char **argv) {
    mt_mlp_config cfg = {.layers = 8, .in_dim = 1024, .width = 1024, .out_dim = 1024, .seed = 1};
    int batch = 8, steps = 5;
    float lr = 3e-4f;
    for (int i = 1; i < argc; i += 2) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        if (strcmp(argv[i], "--layers") == 0) cfg.layers = atoi(v);
        else if (strcmp(argv[i], "--width") == 0) cfg.width = cfg.in_dim = cfg.out_dim = atoi(v);
        else if (strcmp(argv[i], "--batch") == 0) batch = atoi(v);
        else if (strcmp(argv[i], "--steps") == 0) steps = atoi(v);
        else if (strcmp(argv[i], "--lr") == 0) lr = strtof(v, NULL);
        else return usage();
    }
    if (cfg.layers < 1 || cfg.width < 1 || batch < 1 || steps < 1 || !(lr > 0)) return usage();
    demo d = {0};
    int rc = run(&d, cfg, batch, steps, lr);
    free(d.x);
    free(d.y);
    if (d.opt) mt_adamw_destroy(d.opt);
    if (d.mlp) mt_mlp_destroy(d.mlp);
    if (d.mesh) mt_mesh_destroy(d.mesh);
    if (d.rt) mt_finalize(d.rt);
    return rc;
}
