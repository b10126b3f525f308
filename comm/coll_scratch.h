/* Internal: the scratch the host transport's collectives take from a group. comm/coll_build.c
 * sizes its scratch and picks its algorithm with these, and the memory predictor
 * (models/gpt_memory.c) predicts with the same functions. A group keeps its scratch between collectives
 * and only replaces it by a larger one, so a group holds the largest any of its collectives asked
 * for. The memory tests (tests/examples/train_gpt_memory.sh)
 * compare the predictions with the device's accounting. */
#ifndef MT_COMM_COLL_SCRATCH_H
#define MT_COMM_COLL_SCRATCH_H

#include <stdbool.h>
#include <stddef.h>

/* The transport's default MT_COMM_SMALL_BYTES (comm/host/ucx.c takes it from here). */
#define MT_COMM_SMALL_BYTES_DEFAULT ((size_t)64 << 10)

/* Bytes of the table of input pointers a direct reduce puts first in its scratch. */
size_t mt_comm_scratch_direct_table(int n);

/* Whether an all-reduce / a reduce-scatter (count elements left on each rank) of count elements
 * of elem_size over n > 1 ranks is a direct reduce rather than a ring. */
bool mt_comm_all_reduce_is_direct(size_t count, size_t elem_size, int n, size_t small_bytes);
bool mt_comm_reduce_scatter_is_direct(size_t count, size_t elem_size, int n, size_t small_bytes);

/* The largest block of count elements split unevenly over n ranks (the ring's blocks). */
size_t mt_comm_ring_max_block(size_t count, int n);

/* Scratch bytes of an all-reduce of count elements of elem_size over n ranks. */
size_t mt_comm_scratch_all_reduce(size_t count, size_t elem_size, int n, size_t small_bytes);

/* Scratch bytes of a reduce-scatter leaving count elements of elem_size on each of n ranks. */
size_t mt_comm_scratch_reduce_scatter(size_t count, size_t elem_size, int n,
                                      size_t small_bytes);

#endif
