/* Bookkeeping of the CUDA caching allocator: see block_cache.h. */
#include "core/cuda/block_cache.h"

#include <stdlib.h>
#include <string.h>

size_t mt_block_round(size_t bytes) {
    size_t unit = bytes < MT_BLOCK_SMALL_LIMIT ? MT_BLOCK_SMALL_ROUND : MT_BLOCK_LARGE_ROUND;
    if (bytes == 0) bytes = 1;
    if (bytes > SIZE_MAX - (unit - 1)) return 0;
    return (bytes + unit - 1) / unit * unit;
}

static bool list_insert(mt_block_list *l, size_t at, mt_cached_block b) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        mt_cached_block *grown = realloc(l->v, cap * sizeof *grown);
        if (!grown) return false;
        l->v = grown;
        l->cap = cap;
    }
    memmove(&l->v[at + 1], &l->v[at], (l->n - at) * sizeof *l->v);
    l->v[at] = b;
    l->n++;
    l->bytes += b.size;
    return true;
}

static mt_cached_block list_remove(mt_block_list *l, size_t at) {
    mt_cached_block b = l->v[at];
    memmove(&l->v[at], &l->v[at + 1], (l->n - at - 1) * sizeof *l->v);
    l->n--;
    l->bytes -= b.size;
    return b;
}

/* First index whose address is >= ptr. */
static size_t lower_bound_ptr(const mt_block_list *l, const void *ptr) {
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)l->v[mid].ptr < (uintptr_t)ptr) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* First index whose size is >= size. */
static size_t lower_bound_size(const mt_block_list *l, size_t size) {
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->v[mid].size < size) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

bool mt_block_live_add(mt_block_list *live, void *ptr, size_t size) {
    size_t at = lower_bound_ptr(live, ptr);
    if (at < live->n && live->v[at].ptr == ptr) return false;
    return list_insert(live, at, (mt_cached_block){.ptr = ptr, .size = size});
}

bool mt_block_live_remove(mt_block_list *live, const void *ptr, size_t *size) {
    size_t at = lower_bound_ptr(live, ptr);
    if (at == live->n || live->v[at].ptr != ptr) return false;
    *size = list_remove(live, at).size;
    return true;
}

bool mt_block_cache_put(mt_block_list *cache, mt_cached_block block) {
    /* After the blocks of the same size: the oldest free of a size is found (and ready) first. */
    size_t at = lower_bound_size(cache, block.size + 1);
    if (block.size == SIZE_MAX) at = cache->n;
    return list_insert(cache, at, block);
}

long mt_block_cache_find(const mt_block_list *cache, size_t size, uint64_t ready_seq,
                         bool *pending_fit) {
    *pending_fit = false;
    size_t limit = size + size / 8;
    if (limit < size) limit = SIZE_MAX;
    for (size_t i = lower_bound_size(cache, size); i < cache->n && cache->v[i].size <= limit;
         i++) {
        if (cache->v[i].freed_seq <= ready_seq) return (long)i;
        *pending_fit = true;
    }
    return -1;
}

mt_cached_block mt_block_cache_take(mt_block_list *cache, size_t index) {
    return list_remove(cache, index);
}

size_t mt_block_cache_largest(const mt_block_list *cache) {
    return cache->n ? cache->v[cache->n - 1].size : 0;
}

void mt_block_list_release(mt_block_list *list) {
    free(list->v);
    *list = (mt_block_list){0};
}
