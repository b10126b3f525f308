/* Internal: the reference MLP's synthetic data (models/mlp.c), for the in-tree programs that train
 * it: the FSDP examples, the benchmarks and the tests. The same seed, step and sample give the
 * same values whatever the rank count, so runs on different numbers of ranks can be compared. */
#ifndef MT_MODELS_MLP_INTERNAL_H
#define MT_MODELS_MLP_INTERNAL_H

#include <meshtrain/mlp.h>

#include <stdint.h>

/* Deterministic synthetic data: samples [first, first + n) of step `step` of the stream seeded
 * by seed (the same sample whatever the rank count). x: n x in_dim, y: n x out_dim: x uniform in
 * [-1, 1), y = tanh(A x) for a teacher matrix A fixed by the seed. */
void mt_mlp_synthetic_batch(const mt_mlp_config *config, uint64_t seed, long step, long first,
                            int n, float *x, float *y);

#endif
