/* fsdp_mlp: the smallest complete FSDP training program, to copy from.
 *
 *   mtrun --standalone --nproc_per_node 4 fsdp_mlp --layers 8 --width 256 --steps 20
 *
 * Every rank builds the same MLP, shards each layer and then the root over the "dp" dimension of
 * a one-dimensional mesh (all ranks), creates AdamW on its shards and trains on its slice of a
 * synthetic global batch. Rank 0 prints the loss averaged over ranks and, at the end, its memory
 * report: model state per rank is about 1/N of the unsharded model's.
 *
 * Options: --layers N (8) --width N (256) --batch N (global batch, 64) --steps N (20)
 *          --lr X (1e-3) --seed N (1) --param-dtype f32|bf16 (f32)
 */

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct options {
    int layers, width, batch, steps;
    float lr;
    unsigned long long seed;
    mt_dtype param_dtype;
} options;

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.layers = 8, .width = 256, .batch = 64, .steps = 20, .lr = 1e-3f, .seed = 1,
                   .param_dtype = MT_F32};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val) {
            fprintf(stderr, "fsdp_mlp: %s needs a value\n", arg);
            return -1;
        }
        i++;
        if (strcmp(arg, "--layers") == 0) o->layers = atoi(val);
        else if (strcmp(arg, "--width") == 0) o->width = atoi(val);
        else if (strcmp(arg, "--batch") == 0) o->batch = atoi(val);
        else if (strcmp(arg, "--steps") == 0) o->steps = atoi(val);
        else if (strcmp(arg, "--lr") == 0) o->lr = strtof(val, NULL);
        else if (strcmp(arg, "--seed") == 0) o->seed = strtoull(val, NULL, 10);
        else if (strcmp(arg, "--param-dtype") == 0) {
            if (mt_dtype_parse(val, &o->param_dtype) != MT_OK) {
                fprintf(stderr, "fsdp_mlp: --param-dtype %s: use f32 or bf16\n", val);
                return -1;
            }
        } else {
            fprintf(stderr, "fsdp_mlp: unknown option %s\n", arg);
            return -1;
        }
    }
    if (o->layers < 1 || o->width < 1 || o->batch < 1 || o->steps < 0) {
        fprintf(stderr, "fsdp_mlp: --layers, --width and --batch must be >= 1, --steps >= 0\n");
        return -1;
    }
    return 0;
}

/* A value in [-1, 1) for a key: the same on every rank, so sample i of a step is the same sample
 * whatever the rank count (splitmix64's finaliser mixes the key). */
static float uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t h = seed ^ (a * 0x9e3779b97f4a7c15ull) ^ (b * 0xc2b2ae3d27d4eb4full) ^
                 (c * 0x165667b19e3779f9ull);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    return (float)((double)(h >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

/* Samples [first, first + n) of step `step`: x uniform, and the target a fixed "teacher",
 * y = tanh(A x) with A drawn from the seed: something an MLP learns quickly, but not trivially. */
static void synthetic_batch(const mt_mlp_config *cfg, uint64_t seed, int step, long first, int n,
                            float *x, float *y) {
    int in = cfg->in_dim, out = cfg->out_dim;
    float scale = 3.0f / sqrtf((float)in); /* A x then has a spread of order one */
    for (int i = 0; i < n; i++) {
        float *xi = x + (size_t)i * in;
        for (int j = 0; j < in; j++) xi[j] = uniform(seed, 1 + (uint64_t)step, first + i, j);
        for (int o = 0; o < out; o++) {
            float z = 0.0f;
            for (int j = 0; j < in; j++) z += scale * uniform(seed, 0, o, j) * xi[j];
            y[(size_t)i * out + o] = tanhf(z);
        }
    }
}

static mt_status train(mt_runtime *rt, const options *opt) {
    int rank = mt_runtime_rank(rt), world = mt_runtime_world_size(rt);
    if (opt->batch % world != 0) {
        fprintf(stderr, "fsdp_mlp: the global batch %d must be a multiple of the %d ranks\n",
                opt->batch, world);
        mt_clear_error(); /* the message is printed: nothing more to say */
        return MT_ERR_INVALID_ARG;
    }
    int local = opt->batch / world;

    /* A one-dimensional mesh: every rank on "dp", parameters sharded across all of them. */
    mt_mesh *mesh = NULL;
    MT_TRY(mt_mesh_create(rt, 1, (int[]){world}, (const char *[]){"dp"}, &mesh));

    /* The same seed gives the same model on every rank, whatever the rank count. */
    mt_mlp_config cfg = {.layers = opt->layers, .in_dim = opt->width, .width = opt->width,
                         .out_dim = opt->width, .seed = opt->seed};
    mt_mlp *mlp = NULL;
    mt_adamw *adam = NULL;
    float *x = malloc((size_t)local * cfg.in_dim * sizeof *x);
    float *y = malloc((size_t)local * cfg.out_dim * sizeof *y);
    mt_status st = MT_OK;
    if (!x || !y) {
        fprintf(stderr, "fsdp_mlp: rank %d: no host memory for a batch of %d samples\n", rank,
                local);
        mt_clear_error(); /* the message is printed: nothing more to say */
        st = MT_ERR_OUT_OF_MEMORY;
    }
    if (st == MT_OK) st = mt_mlp_create(mesh, &cfg, &mlp);

    /* fully_shard: each layer is a unit, then the root takes whatever is left. */
    mt_fsdp_options fo = mt_fsdp_defaults(mesh, "dp");
    fo.param_dtype = opt->param_dtype;
    for (int l = 0; l < cfg.layers && st == MT_OK; l++)
        st = mt_fsdp_shard(mt_mlp_layer(mlp, l), &fo);
    if (st == MT_OK) st = mt_fsdp_shard(mt_mlp_root(mlp), &fo);

    /* The optimizer comes after sharding: it holds state for this rank's shards only. */
    if (st == MT_OK)
        st = mt_adamw_create(mt_mlp_root(mlp), &(mt_adamw_options){.lr = opt->lr}, &adam);
    if (st == MT_OK && rank == 0)
        printf("fsdp_mlp: %zu parameters, %d layers of width %d, %d ranks, global batch %d, "
               "params in %s\n",
               mt_mlp_param_count(mlp), cfg.layers, cfg.width, world, opt->batch,
               mt_dtype_name(opt->param_dtype));

    mt_group *dp = NULL;
    if (st == MT_OK) st = mt_mesh_group(mesh, "dp", &dp);
    for (int step = 0; step < opt->steps && st == MT_OK; step++) {
        /* This rank's slice of the step's global batch. */
        synthetic_batch(&cfg, opt->seed, step, (long)rank * local, local, x, y);
        float loss = 0.0f;
        st = mt_mlp_forward_backward(mlp, x, y, local, 1.0f, &loss);
        if (st == MT_OK) st = mt_clip_grad_norm(mt_mlp_root(mlp), 1.0f, NULL);
        if (st == MT_OK) st = mt_adamw_step(adam);
        if (st == MT_OK) st = mt_zero_grad(mt_mlp_root(mlp));
        /* Each rank saw its own samples: the loss of the global batch is the mean. */
        if (st == MT_OK) st = mt_all_reduce(dp, &loss, &loss, 1, MT_F32, MT_REDUCE_AVG, NULL);
        if (st == MT_OK && rank == 0) printf("step %d loss %.6f\n", step, (double)loss);
    }

    if (st == MT_OK && rank == 0) {
        char report[1024];
        printf("memory (rank 0):\n%s\n", mt_memory_report(mt_runtime_device(rt), report,
                                                          sizeof report));
    }
    mt_adamw_destroy(adam);
    mt_mlp_destroy(mlp);
    mt_mesh_destroy(mesh);
    free(x);
    free(y);
    return st;
}

int main(int argc, char **argv) {
    options opt;
    if (parse_args(argc, argv, &opt) != 0) return 2;
    mt_runtime *rt = NULL;
    mt_status st = mt_init(&rt, &argc, &argv);
    if (st == MT_OK) st = train(rt, &opt);
    if (st != MT_OK && mt_last_error()[0]) fprintf(stderr, "fsdp_mlp: %s\n", mt_last_error());
    if (rt) mt_finalize(rt);
    return st == MT_OK ? 0 : 1;
}
