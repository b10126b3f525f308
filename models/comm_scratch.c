/* Scratch sizes of the host transport's collectives (models/comm_scratch.h), as
 * comm/coll_build.c asks for them: all-gathers and broadcasts take none. */
#include "models/comm_scratch.h"

/* A direct reduce puts a table of the members' input pointers first, rounded to 64 bytes. */
static size_t direct_table(int n) { return ((size_t)n * sizeof(void *) + 63) / 64 * 64; }

size_t mt_comm_scratch_all_reduce(size_t count, size_t elem_size, int n, size_t small_bytes) {
    if (count == 0 || n <= 1) return 0; /* a copy, no scratch */
    size_t bytes = count * elem_size;
    if (bytes <= small_bytes || count < (size_t)n) return direct_table(n) + (size_t)n * bytes;
    /* The ring's blocks split count unevenly; its two buffers hold the largest. */
    size_t maxblock = 0;
    for (int i = 0; i < n; i++) {
        size_t lo = (size_t)((unsigned __int128)count * (unsigned)i / (unsigned)n);
        size_t hi = (size_t)((unsigned __int128)count * (unsigned)(i + 1) / (unsigned)n);
        if (hi - lo > maxblock) maxblock = hi - lo;
    }
    return 2 * maxblock * elem_size;
}

size_t mt_comm_scratch_reduce_scatter(size_t count, size_t elem_size, int n,
                                      size_t small_bytes) {
    if (count == 0 || n <= 1) return 0;
    size_t bytes = count * elem_size;
    if (bytes * (size_t)n <= small_bytes) return direct_table(n) + (size_t)n * bytes;
    return 2 * bytes;
}
