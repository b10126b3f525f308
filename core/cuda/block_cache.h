/* Internal: the bookkeeping of the CUDA caching allocator (core/cuda/cuda_alloc.c), kept free of
 * CUDA calls so that it is tested on any machine (tests/gpu/test_block_cache.c).
 *
 * Two sorted arrays of blocks: the live blocks by address (to find a block's rounded size when it
 * is freed: the device interface frees by pointer only) and the cached blocks by size (best fit).
 * A cached block carries the sequence number of its free; it may be handed out again only once
 * the caller knows that all GPU work queued before that free is done (freed_seq <= ready_seq).
 * Not thread-safe: the allocator holds its lock around every call.
 */
#ifndef MT_CORE_CUDA_BLOCK_CACHE_H
#define MT_CORE_CUDA_BLOCK_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Requests below MT_BLOCK_SMALL_LIMIT are rounded up to 512 bytes, larger ones to 2 MiB: the
 * driver maps large allocations in 2 MiB pages anyway, and coarse sizes make reuse likely. */
#define MT_BLOCK_SMALL_LIMIT ((size_t)1 << 20)
#define MT_BLOCK_SMALL_ROUND ((size_t)512)
#define MT_BLOCK_LARGE_ROUND ((size_t)2 << 20)

typedef struct mt_cached_block {
    void *ptr;
    size_t size;        /* rounded size, what cudaMalloc was asked for */
    uint64_t freed_seq; /* cached blocks only */
} mt_cached_block;

typedef struct mt_block_list {
    mt_cached_block *v;
    size_t n, cap;
    size_t bytes; /* sum of the sizes */
} mt_block_list;

/* The size a request of bytes (> 0) is served with; 0 when rounding would overflow. */
size_t mt_block_round(size_t bytes);

/* Live blocks (sorted by address). add returns false when the host is out of memory or ptr is
 * already there; remove returns false when ptr is not live. */
bool mt_block_live_add(mt_block_list *live, void *ptr, size_t size);
bool mt_block_live_remove(mt_block_list *live, const void *ptr, size_t *size);

/* Cached blocks (sorted by size). put returns false when the host is out of memory. */
bool mt_block_cache_put(mt_block_list *cache, mt_cached_block block);

/* Index of the smallest cached block that serves size (rounded) without wasting more than an
 * eighth of it and whose free is known complete (freed_seq <= ready_seq), or -1. *pending_fit
 * says whether a block of a fitting size exists that is not ready yet. */
long mt_block_cache_find(const mt_block_list *cache, size_t size, uint64_t ready_seq,
                         bool *pending_fit);

/* Removes and returns the block at index. */
mt_cached_block mt_block_cache_take(mt_block_list *cache, size_t index);

/* Size of the largest cached block (0 when empty). */
size_t mt_block_cache_largest(const mt_block_list *cache);

void mt_block_list_release(mt_block_list *list);

#endif
