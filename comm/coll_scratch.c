/* Scratch sizes of the host transport's collectives (comm/coll_scratch.h): comm/coll_build.c
 * asks for exactly these, and the memory predictor (models/gpt_memory.c) predicts with them.
 * All-gathers and broadcasts take none. */
#include "comm/coll_scratch.h"

size_t mt_comm_scratch_direct_table(int n) {
    return ((size_t)n * sizeof(void *) + 63) / 64 * 64;
}

bool mt_comm_all_reduce_is_direct(size_t count, size_t elem_size, int n, size_t small_bytes) {
    return count * elem_size <= small_bytes || count < (size_t)n;
}

bool mt_comm_reduce_scatter_is_direct(size_t count, size_t elem_size, int n,
                                      size_t small_bytes) {
    return count * elem_size * (size_t)n <= small_bytes;
}

size_t mt_comm_ring_max_block(size_t count, int n) {
    size_t maxblock = 0;
    for (int i = 0; i < n; i++) {
        size_t lo = (size_t)((unsigned __int128)count * (unsigned)i / (unsigned)n);
        size_t hi = (size_t)((unsigned __int128)count * (unsigned)(i + 1) / (unsigned)n);
        if (hi - lo > maxblock) maxblock = hi - lo;
    }
    return maxblock;
}

size_t mt_comm_scratch_all_reduce(size_t count, size_t elem_size, int n, size_t small_bytes) {
    if (count == 0 || n <= 1) return 0; /* a copy, no scratch */
    if (mt_comm_all_reduce_is_direct(count, elem_size, n, small_bytes))
        return mt_comm_scratch_direct_table(n) + (size_t)n * count * elem_size;
    /* The ring's blocks split count unevenly; its two buffers hold the largest. */
    return 2 * mt_comm_ring_max_block(count, n) * elem_size;
}

size_t mt_comm_scratch_reduce_scatter(size_t count, size_t elem_size, int n,
                                      size_t small_bytes) {
    if (count == 0 || n <= 1) return 0;
    if (mt_comm_reduce_scatter_is_direct(count, elem_size, n, small_bytes))
        return mt_comm_scratch_direct_table(n) + (size_t)n * count * elem_size;
    return 2 * count * elem_size;
}
