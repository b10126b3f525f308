/* The CPU device: host memory. Work runs synchronously on the calling thread, so streams and
 * events only keep the ordering API usable (device.c validates their use). */
#include "core/device_internal.h"
#include "core/env.h"
#include "core/error.h"
#include "core/host_alloc.h"
#include "core/shm_block.h"

#include <meshtrain/memory.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Blocks of at least MT_SHM_BLOCK_MIN_BYTES live in shared memory (memfd) that local peers can
 * map, so that collectives between ranks of one host copy with memcpy (core/shm_block.h).
 * MT_CPU_SHARED_MEMORY=0 turns it off. */

typedef struct shared_block {
    char *base;
    size_t mapped;
    int fd;
    uint64_t serial;
} shared_block;

/* Freed shared blocks are kept (mapped, fd open, same serial) up to this many bytes and handed
 * out again for a request of nearly the same size: FSDP frees and re-allocates the same full
 * buffers every step, and a fresh block costs a page fault per page on first touch (40% of a
 * step in a profile). Peers keep their mapping of a reused block, since fd and serial do not
 * change. MT_CPU_CACHE_BYTES sets the limit (0 turns the cache off). The accounting in device.c
 * counts allocated bytes only, as PyTorch's caching allocator reports "allocated", not
 * "reserved". */
#define CACHE_DEFAULT_BYTES ((size_t)1 << 30)

/* Shared blocks sorted by base, so that a range lookup is a binary search. */
typedef struct cpu_backend {
    pthread_mutex_t lock;
    bool shared_enabled;
    shared_block *blocks;
    size_t count, cap;
    uint64_t next_serial;
    shared_block *cached; /* freed blocks kept for reuse */
    size_t n_cached, cap_cached, cached_bytes, cache_limit;
} cpu_backend;

/* Index of the last block whose base <= ptr, or -1. Caller holds the lock. */
static long find_block(const cpu_backend *b, const void *ptr) {
    long lo = 0, hi = (long)b->count - 1, found = -1;
    while (lo <= hi) {
        long mid = (lo + hi) / 2;
        if ((const char *)b->blocks[mid].base <= (const char *)ptr) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

static bool remember_block(cpu_backend *b, shared_block blk) {
    if (b->count == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 16;
        shared_block *grown = realloc(b->blocks, cap * sizeof *grown);
        if (!grown) return false;
        b->blocks = grown;
        b->cap = cap;
    }
    long at = find_block(b, blk.base) + 1;
    memmove(&b->blocks[at + 1], &b->blocks[at], (b->count - (size_t)at) * sizeof *b->blocks);
    b->blocks[at] = blk;
    b->count++;
    return true;
}

/* Takes the smallest cached block that holds bytes without wasting more than an eighth of it;
 * caller holds the lock. */
static bool take_cached(cpu_backend *b, size_t bytes, shared_block *out) {
    long best = -1;
    for (size_t i = 0; i < b->n_cached; i++) {
        size_t m = b->cached[i].mapped;
        if (m >= bytes && m - bytes <= m / 8 && (best < 0 || m < b->cached[best].mapped))
            best = (long)i;
    }
    if (best < 0) return false;
    *out = b->cached[best];
    b->cached[best] = b->cached[--b->n_cached];
    b->cached_bytes -= out->mapped;
    return true;
}

/* Keeps a freed block for reuse when the cache has room; caller holds the lock. */
static bool keep_cached(cpu_backend *b, shared_block blk) {
    if (b->cached_bytes + blk.mapped > b->cache_limit) return false;
    if (b->n_cached == b->cap_cached) {
        size_t cap = b->cap_cached ? b->cap_cached * 2 : 16;
        shared_block *grown = realloc(b->cached, cap * sizeof *grown);
        if (!grown) return false;
        b->cached = grown;
        b->cap_cached = cap;
    }
    b->cached[b->n_cached++] = blk;
    b->cached_bytes += blk.mapped;
    return true;
}

static void *alloc_shared(cpu_backend *b, size_t bytes) {
    pthread_mutex_lock(&b->lock);
    shared_block reused;
    if (take_cached(b, bytes, &reused)) {
        bool kept = remember_block(b, reused);
        if (!kept) keep_cached(b, reused); /* cannot fail: it was just taken out */
        pthread_mutex_unlock(&b->lock);
        if (kept) return reused.base;
    } else {
        pthread_mutex_unlock(&b->lock);
    }
    shared_block blk = {.fd = -1};
    blk.base = mt_shm_block_alloc(bytes, &blk.fd, &blk.mapped);
    if (!blk.base) return NULL; /* e.g. out of file descriptors: the caller uses private memory */
    pthread_mutex_lock(&b->lock);
    blk.serial = ++b->next_serial;
    bool kept = remember_block(b, blk);
    pthread_mutex_unlock(&b->lock);
    if (!kept) {
        mt_shm_block_free(blk.base, blk.mapped, blk.fd);
        return NULL;
    }
    return blk.base;
}

static mt_status cpu_alloc(mt_device *dev, size_t bytes, void **out) {
    cpu_backend *b = dev->backend;
    void *ptr = NULL;
    if (b->shared_enabled && bytes >= MT_SHM_BLOCK_MIN_BYTES) ptr = alloc_shared(b, bytes);
    if (!ptr) {
        errno = 0;
        ptr = mt_host_alloc(bytes, MT_DEVICE_ALIGNMENT);
    }
    if (!ptr)
        return mt_error_errno(MT_ERR_OUT_OF_MEMORY, errno ? errno : ENOMEM,
                              "the host allocator refused it");
    *out = ptr;
    return MT_OK;
}

static void cpu_free(mt_device *dev, void *ptr) {
    cpu_backend *b = dev->backend;
    pthread_mutex_lock(&b->lock);
    long i = find_block(b, ptr);
    if (i >= 0 && b->blocks[i].base == ptr) {
        shared_block blk = b->blocks[i];
        memmove(&b->blocks[i], &b->blocks[i + 1], (b->count - (size_t)i - 1) * sizeof *b->blocks);
        b->count--;
        bool cached = keep_cached(b, blk);
        pthread_mutex_unlock(&b->lock);
        if (!cached) mt_shm_block_free(blk.base, blk.mapped, blk.fd);
        return;
    }
    pthread_mutex_unlock(&b->lock);
    free(ptr);
}

bool mt_device_shared_range(mt_device *dev, const void *ptr, size_t bytes, mt_shm_ref *ref) {
    if (!dev || dev->kind != MT_DEVICE_CPU || !dev->backend || !ptr) return false;
    cpu_backend *b = dev->backend;
    bool inside = false;
    pthread_mutex_lock(&b->lock);
    long i = find_block(b, ptr);
    if (i >= 0) {
        const shared_block *blk = &b->blocks[i];
        size_t offset = (size_t)((const char *)ptr - blk->base);
        inside = offset <= blk->mapped && bytes <= blk->mapped - offset;
        if (inside)
            *ref = (mt_shm_ref){.pid = (int32_t)getpid(), .fd = blk->fd, .serial = blk->serial,
                                .block_size = blk->mapped, .offset = offset};
    }
    pthread_mutex_unlock(&b->lock);
    return inside;
}

static mt_status cpu_copy(mt_device *dev, void *dst, const void *src, size_t bytes,
                          mt_copy_kind kind, mt_stream *stream) {
    /* memmove: a copy within one buffer (shifting a shard) must not depend on direction. */
    memmove(dst, src, bytes);
    return MT_OK;
}

static mt_status cpu_memset(mt_device *dev, void *dst, int value, size_t bytes,
                            mt_stream *stream) {
    memset(dst, value, bytes);
    return MT_OK;
}

static mt_status cpu_nothing_to_wait(mt_device *dev) { return MT_OK; }
static mt_status cpu_stream_create(mt_device *dev, mt_stream *stream) { return MT_OK; }
static void cpu_stream_destroy(mt_stream *stream) {}
static mt_status cpu_stream_synchronize(mt_stream *stream) { return MT_OK; }
static mt_status cpu_stream_wait_event(mt_stream *stream, mt_event *event) { return MT_OK; }
static mt_status cpu_event_create(mt_device *dev, mt_event *event) { return MT_OK; }
static void cpu_event_destroy(mt_event *event) {}
static mt_status cpu_event_record(mt_event *event, mt_stream *stream) { return MT_OK; }
static mt_status cpu_event_synchronize(mt_event *event) { return MT_OK; }

static mt_status cpu_event_query(mt_event *event, bool *done) {
    *done = true;
    return MT_OK;
}

static void cpu_close(mt_device *dev);

static const mt_device_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .memset = cpu_memset,
    .synchronize = cpu_nothing_to_wait,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_synchronize = cpu_stream_synchronize,
    .stream_wait_event = cpu_stream_wait_event,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_synchronize = cpu_event_synchronize,
    .event_query = cpu_event_query,
    .close = cpu_close,
};

static void cpu_close(mt_device *dev) {
    cpu_backend *b = dev->backend;
    if (!b) return;
    for (size_t i = 0; i < b->n_cached; i++)
        mt_shm_block_free(b->cached[i].base, b->cached[i].mapped, b->cached[i].fd);
    free(b->cached);
    pthread_mutex_destroy(&b->lock);
    free(b->blocks);
    free(b);
    dev->backend = NULL;
}

mt_status mt_cpu_device_init(mt_device *dev) {
    cpu_backend *b = calloc(1, sizeof *b);
    if (!b) return mt_error(MT_ERR_OUT_OF_MEMORY, "allocating the CPU device's state");
    pthread_mutex_init(&b->lock, NULL);
    const char *env = getenv("MT_CPU_SHARED_MEMORY");
    b->shared_enabled = !(env && !strcmp(env, "0"));
    b->cache_limit = CACHE_DEFAULT_BYTES;
    if (mt_env_bytes("MT_CPU_CACHE_BYTES", 0, SIZE_MAX, CACHE_DEFAULT_BYTES,
                     "bytes the CPU device's cache keeps; 0 turns it off",
                     &b->cache_limit) != MT_OK) {
        mt_status st = mt_error_wrap(MT_ERR_INVALID_ARG, "cannot open the cpu device");
        pthread_mutex_destroy(&b->lock);
        free(b);
        return st;
    }
    dev->ops = &cpu_ops;
    dev->backend = b;
    return MT_OK;
}
