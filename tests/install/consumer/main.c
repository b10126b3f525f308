/* A program outside the meshtrain tree, built against the installed package: it only sees the
 * public headers and the installed library. It checks a few pure calls, then does what a training
 * program does: mt_init (by hand or under mtrun), a mesh of every rank on "dp", a small MLP
 * sharded with FSDP, AdamW, and a few steps whose global loss must fall. Exits 0 when every call
 * gave the expected result. */
#include <meshtrain/meshtrain.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define EXPECT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "consumer: %s:%d: expected %s (%s)\n", __FILE__, __LINE__, #cond,      \
                    mt_last_error());                                                              \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static void pure_calls(void) {
    EXPECT(strcmp(mt_version(), "0.1.0") >= 0 && strchr(mt_version(), '.') != NULL);
    EXPECT(mt_f32_to_bf16(1.0f) == 0x3f80);
    EXPECT(mt_bf16_to_f32(0x4049) == 3.140625f);
    mt_dtype dtype;
    EXPECT(mt_dtype_parse("bfloat16", &dtype) == MT_OK && dtype == MT_BF16);
    size_t bytes = 0;
    EXPECT(mt_parse_bytes("2 MiB", &bytes) == MT_OK && bytes == 2u << 20);

    mt_device *dev = NULL;
    EXPECT(mt_device_open_cpu(1u << 20, &dev) == MT_OK);
    if (!dev) return;
    void *p = NULL;
    EXPECT(mt_device_alloc(dev, 4096, MT_MEM_PARAMS, &p) == MT_OK && p != NULL);
    void *too_big = NULL;
    EXPECT(mt_device_alloc(dev, 2u << 20, MT_MEM_ACTIVATIONS, &too_big) == MT_ERR_OUT_OF_MEMORY);
    EXPECT(strstr(mt_last_error(), "out of memory") != NULL);
    mt_mem_stats stats;
    mt_device_mem_stats(dev, &stats);
    EXPECT(stats.current[MT_MEM_PARAMS] == 4096 && stats.capacity == 1u << 20);
    mt_device_free(dev, p);
    mt_device_close(dev);
}

/* y = a fixed function of x, so that a few steps of training lower the loss. */
static void make_batch(int first, int n, int dim, float *x, float *y) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < dim; j++) {
            float v = (float)(((first + i) * 7 + j * 3) % 11) / 11.0f - 0.5f;
            x[(size_t)i * dim + j] = v;
            y[(size_t)i * dim + j] = 0.5f * v;
        }
}

static mt_status train(mt_runtime *rt) {
    enum { DIM = 16, GLOBAL_BATCH = 8, STEPS = 5 };
    int rank = mt_runtime_rank(rt), world = mt_runtime_world_size(rt);
    if (GLOBAL_BATCH % world != 0)
        return MT_ERR_INVALID_ARG;
    int local = GLOBAL_BATCH / world;
    mt_mesh *mesh = NULL;
    MT_TRY(mt_mesh_create(rt, 1, (int[]){world}, (const char *[]){"dp"}, &mesh));
    mt_mlp_config cfg = {.layers = 2, .in_dim = DIM, .width = DIM, .out_dim = DIM, .seed = 7};
    mt_mlp *mlp = NULL;
    mt_adamw *adam = NULL;
    mt_group *dp = NULL;
    float x[GLOBAL_BATCH * DIM], y[GLOBAL_BATCH * DIM], first = 0.0f, last = 0.0f;
    mt_status st = mt_mlp_create(mesh, &cfg, &mlp);
    mt_fsdp_options fo = mt_fsdp_defaults(mesh, "dp");
    for (int l = 0; l < cfg.layers && st == MT_OK; l++)
        st = mt_fsdp_shard(mt_mlp_layer(mlp, l), &fo);
    if (st == MT_OK) st = mt_fsdp_shard(mt_mlp_root(mlp), &fo);
    if (st == MT_OK)
        st = mt_adamw_create(mt_mlp_root(mlp), &(mt_adamw_options){.lr = 1e-2f}, &adam);
    if (st == MT_OK) st = mt_mesh_group(mesh, "dp", &dp);
    make_batch(rank * local, local, DIM, x, y);
    for (int step = 0; step < STEPS && st == MT_OK; step++) {
        float loss = 0.0f;
        st = mt_mlp_forward_backward(mlp, x, y, local, 1.0f, &loss);
        if (st == MT_OK) st = mt_adamw_step(adam);
        if (st == MT_OK) st = mt_zero_grad(mt_mlp_root(mlp));
        if (st == MT_OK) st = mt_all_reduce(dp, &loss, &loss, 1, MT_F32, MT_REDUCE_AVG, NULL);
        if (step == 0) first = loss;
        last = loss;
    }
    if (st == MT_OK) {
        EXPECT(last < first);
        if (rank == 0)
            printf("consumer: %d rank(s), %zu parameters sharded on dp, loss %.5f -> %.5f over %d "
                   "steps\n", world, mt_mlp_param_count(mlp), (double)first, (double)last, STEPS);
    }
    mt_adamw_destroy(adam);
    mt_mlp_destroy(mlp);
    mt_mesh_destroy(mesh);
    return st;
}

int main(int argc, char **argv) {
    pure_calls();
    mt_runtime *rt = NULL;
    mt_status st = mt_init(&rt, &argc, &argv);
    if (st == MT_OK) st = train(rt);
    EXPECT(st == MT_OK);
    int rank = rt ? mt_runtime_rank(rt) : 0;
    if (rt) mt_finalize(rt);
    if (rank == 0 || failures)
        printf("consumer: meshtrain %s: %s\n", mt_version(), failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
