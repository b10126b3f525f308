/* Internal: the counter-based hash behind the seed-defined values of the library's initialisers
 * (module/param_init.c) and the reference models' synthetic data (models/): a value is a pure
 * function of its key, so every rank computes the same one for the same global element without
 * communicating and whatever part of the tensor it holds. */
#ifndef MT_MODULE_PARAM_HASH_H
#define MT_MODULE_PARAM_HASH_H

#include <stdint.h>

/* SplitMix64's finaliser: a well-mixed 64-bit value from any 64-bit key. */
uint64_t mt_hash_mix64(uint64_t z);

/* Uniform in (0, 1), never 0 nor 1, for (seed, stream, index, salt). */
double mt_hash_open_unit(uint64_t seed, uint64_t stream, uint64_t index, uint64_t salt);

/* Standard normal for (seed, stream, index) (Box-Muller on salts 1 and 2). */
double mt_hash_normal(uint64_t seed, uint64_t stream, uint64_t index);

#endif
