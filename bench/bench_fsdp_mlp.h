/* The model both FSDP benchmarks train (mt-bench-fsdp-memory, mt-bench-fsdp-overlap): the
 * reference MLP with every layer width x width on a one-dimensional "dp" mesh of all ranks, one
 * FSDP unit per layer and then the root, with host buffers for one rank's batch. */
#ifndef MT_BENCH_FSDP_MLP_H
#define MT_BENCH_FSDP_MLP_H

#include <meshtrain/meshtrain.h>

typedef struct mt_bench_mlp {
    mt_mesh *mesh;
    mt_mlp *mlp;
    mt_mlp_config cfg;
    float *x, *y; /* batch x width each */
} mt_bench_mlp;

/* Builds and shards the model (seed 1; prog names the program in messages). On failure what was
 * built is left in *b for mt_bench_mlp_destroy. */
mt_status mt_bench_mlp_create(mt_runtime *rt, const char *prog, int layers, int width, int batch,
                              mt_bench_mlp *b);
void mt_bench_mlp_destroy(mt_bench_mlp *b);

#endif
