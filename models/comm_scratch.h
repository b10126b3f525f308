/* Internal: the scratch the host transport's collectives take from a group (comm/coll_build.c),
 * for the memory predictor (models/gpt_memory.c). A group keeps its scratch between collectives
 * and only replaces it by a larger one, so a group holds the largest any of its collectives asked
 * for. These mirror the size rules of coll_build.c; the memory tests (tests/examples/
 * train_gpt_memory.sh) compare the predictions with the device's accounting, so a change there
 * that is not made here fails them. */
#ifndef MT_MODELS_COMM_SCRATCH_H
#define MT_MODELS_COMM_SCRATCH_H

#include <stddef.h>

/* The transport's default MT_COMM_SMALL_BYTES (comm/host/ucx.c). */
#define MT_COMM_SMALL_BYTES_DEFAULT ((size_t)64 << 10)

/* Scratch bytes of an all-reduce of count elements of elem_size over n ranks. */
size_t mt_comm_scratch_all_reduce(size_t count, size_t elem_size, int n, size_t small_bytes);

/* Scratch bytes of a reduce-scatter leaving count elements of elem_size on each of n ranks. */
size_t mt_comm_scratch_reduce_scatter(size_t count, size_t elem_size, int n,
                                      size_t small_bytes);

#endif
