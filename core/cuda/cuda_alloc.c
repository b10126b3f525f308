/* The CUDA caching allocator (core/cuda/cuda_internal.h). One lock guards everything; cudaMalloc
 * and cudaFree run under it, which keeps the reasoning simple (they are slow, but a training step
 * reaches them only while the cache warms up). */
#include "core/cuda/block_cache.h"
#include "core/cuda/cuda_internal.h"
#include "core/error.h"

#include <meshtrain/log.h>
#include <meshtrain/memory.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* A fence covers every free up to `covers`: it is one event on the allocator's own stream, which
 * first waited for a marker event on each known stream. A few in flight are enough: when all are
 * pending, a request that finds no ready block goes to cudaMalloc. */
#define FENCES 4

typedef struct fence {
    cudaEvent_t event;
    uint64_t covers;
    bool pending;
} fence;

typedef struct tracked_stream {
    cudaStream_t stream;
    cudaEvent_t marker;
} tracked_stream;

struct mt_cuda_alloc {
    pthread_mutex_t lock;
    int device;
    char name[32];
    size_t cache_limit;
    mt_block_list live, cache;
    uint64_t free_seq;  /* frees so far */
    uint64_t ready_seq; /* every free up to this one is complete on the GPU */
    uint64_t mallocs, reuses;
    cudaStream_t fence_stream;
    fence fences[FENCES];
    tracked_stream *streams; /* [0] is the legacy default stream */
    size_t n_streams, cap_streams;
    bool fence_warned;
};

static void clear_error(void) { (void)cudaGetLastError(); }

static mt_status cuda_error(const mt_cuda_alloc *a, cudaError_t err, const char *what) {
    clear_error();
    return mt_error(err == cudaErrorMemoryAllocation ? MT_ERR_OUT_OF_MEMORY : MT_ERR_SYSTEM,
                    "%s on %s failed: %s (%s)", what, a->name, cudaGetErrorString(err),
                    cudaGetErrorName(err));
}

static bool add_stream(mt_cuda_alloc *a, cudaStream_t stream) {
    if (a->n_streams == a->cap_streams) {
        size_t cap = a->cap_streams ? a->cap_streams * 2 : 8;
        tracked_stream *grown = realloc(a->streams, cap * sizeof *grown);
        if (!grown) return false;
        a->streams = grown;
        a->cap_streams = cap;
    }
    cudaEvent_t marker;
    if (cudaEventCreateWithFlags(&marker, cudaEventDisableTiming) != cudaSuccess) {
        clear_error();
        return false;
    }
    a->streams[a->n_streams++] = (tracked_stream){stream, marker};
    return true;
}

mt_status mt_cuda_alloc_create(int device, const char *name, size_t cache_limit,
                               mt_cuda_alloc **out) {
    *out = NULL;
    mt_cuda_alloc *a = calloc(1, sizeof *a);
    if (!a) return mt_error(MT_ERR_OUT_OF_MEMORY, "cannot allocate the allocator of %s", name);
    int rc = pthread_mutex_init(&a->lock, NULL);
    if (rc) {
        free(a);
        return mt_error_errno(MT_ERR_SYSTEM, rc, "cannot create the allocator lock of %s", name);
    }
    a->device = device;
    snprintf(a->name, sizeof a->name, "%s", name);
    a->cache_limit = cache_limit;
    mt_status st = MT_OK;
    cudaError_t err = cudaStreamCreateWithFlags(&a->fence_stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        a->fence_stream = NULL;
        st = cuda_error(a, err, "creating the allocator's fence stream");
    }
    for (int i = 0; st == MT_OK && i < FENCES; i++) {
        err = cudaEventCreateWithFlags(&a->fences[i].event, cudaEventDisableTiming);
        if (err != cudaSuccess) {
            a->fences[i].event = NULL;
            st = cuda_error(a, err, "creating the allocator's fence events");
        }
    }
    if (st == MT_OK && !add_stream(a, cudaStreamLegacy))
        st = mt_error(MT_ERR_SYSTEM, "cannot create the default stream's marker event on %s",
                      name);
    if (st != MT_OK) {
        mt_cuda_alloc_destroy(a);
        return st;
    }
    *out = a;
    return MT_OK;
}

/* Frees the cached blocks whose free is complete; caller holds the lock. Returns the bytes. */
static size_t release_ready(mt_cuda_alloc *a) {
    size_t released = 0;
    for (size_t i = a->cache.n; i-- > 0;) {
        if (a->cache.v[i].freed_seq > a->ready_seq) continue;
        mt_cached_block b = mt_block_cache_take(&a->cache, i);
        cudaError_t err = cudaFree(b.ptr);
        if (err != cudaSuccess) {
            clear_error();
            mt_log(MT_LOG_WARN, "cudaFree of a cached block on %s failed: %s", a->name,
                   cudaGetErrorString(err));
        }
        released += b.size;
    }
    return released;
}

void mt_cuda_alloc_destroy(mt_cuda_alloc *a) {
    if (!a) return;
    (void)cudaSetDevice(a->device);
    /* Everything is done once the device is idle; a sticky error leaves pending blocks to the
     * driver, which frees them with the context. */
    if (cudaDeviceSynchronize() == cudaSuccess) a->ready_seq = a->free_seq;
    clear_error();
    release_ready(a);
    for (size_t i = 0; i < a->n_streams; i++) cudaEventDestroy(a->streams[i].marker);
    for (int i = 0; i < FENCES; i++)
        if (a->fences[i].event) cudaEventDestroy(a->fences[i].event);
    if (a->fence_stream) cudaStreamDestroy(a->fence_stream);
    clear_error();
    mt_block_list_release(&a->live);
    mt_block_list_release(&a->cache);
    free(a->streams);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

/* Moves ready_seq past every completed fence; caller holds the lock. */
static void poll_fences(mt_cuda_alloc *a) {
    for (int i = 0; i < FENCES; i++) {
        fence *f = &a->fences[i];
        if (!f->pending) continue;
        cudaError_t err = cudaEventQuery(f->event);
        if (err == cudaErrorNotReady) {
            clear_error();
            continue;
        }
        /* Another error is sticky and will show in the caller's next CUDA call; the fence is
         * dropped so that its blocks wait for a device synchronisation instead. */
        if (err != cudaSuccess) clear_error();
        else if (f->covers > a->ready_seq) a->ready_seq = f->covers;
        f->pending = false;
    }
}

/* Records a fence covering every free so far, unless one in flight already does or all are in
 * flight; caller holds the lock. A failure only delays reuse, so it is a warning. */
static void record_fence(mt_cuda_alloc *a) {
    fence *slot = NULL;
    for (int i = 0; i < FENCES; i++) {
        if (a->fences[i].pending && a->fences[i].covers >= a->free_seq) return;
        if (!a->fences[i].pending && !slot) slot = &a->fences[i];
    }
    if (!slot) return;
    cudaError_t err = cudaSuccess;
    for (size_t i = 0; i < a->n_streams && err == cudaSuccess; i++) {
        err = cudaEventRecord(a->streams[i].marker, a->streams[i].stream);
        if (err == cudaSuccess) err = cudaStreamWaitEvent(a->fence_stream, a->streams[i].marker, 0);
    }
    if (err == cudaSuccess) err = cudaEventRecord(slot->event, a->fence_stream);
    if (err != cudaSuccess) {
        clear_error();
        if (!a->fence_warned)
            mt_log(MT_LOG_WARN, "%s: the caching allocator cannot record a fence (%s); freed "
                   "blocks are reused only after a device synchronisation", a->name,
                   cudaGetErrorString(err));
        a->fence_warned = true;
        return;
    }
    slot->covers = a->free_seq;
    slot->pending = true;
}

/* Serves size from the cache if a ready block fits; caller holds the lock. */
static bool take_ready(mt_cuda_alloc *a, size_t size, void **out, bool *pending_fit) {
    long i = mt_block_cache_find(&a->cache, size, a->ready_seq, pending_fit);
    if (i < 0) return false;
    mt_cached_block b = mt_block_cache_take(&a->cache, (size_t)i);
    if (!mt_block_live_add(&a->live, b.ptr, b.size)) {
        (void)mt_block_cache_put(&a->cache, b); /* room is there: it was just taken out */
        return false;
    }
    a->reuses++;
    *out = b.ptr;
    return true;
}

static mt_status oom_error(mt_cuda_alloc *a, size_t size, cudaError_t err, size_t cached_before,
                           size_t cached_blocks_before, size_t largest_cached, size_t released) {
    size_t free_b = 0, total_b = 0;
    bool info = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess;
    clear_error();
    char asked[32], live[32], cached[32], largest[32], rel[32], fr[32], tot[32];
    mt_format_bytes(size, asked, sizeof asked);
    mt_format_bytes(a->live.bytes, live, sizeof live);
    mt_format_bytes(cached_before, cached, sizeof cached);
    mt_format_bytes(largest_cached, largest, sizeof largest);
    mt_format_bytes(released, rel, sizeof rel);
    mt_format_bytes(free_b, fr, sizeof fr);
    mt_format_bytes(total_b, tot, sizeof tot);
    char gpu[128];
    if (info)
        snprintf(gpu, sizeof gpu, "the largest free block is at most %s (cudaMemGetInfo: %s free "
                 "of %s)", fr, fr, tot);
    else
        snprintf(gpu, sizeof gpu, "cudaMemGetInfo failed too");
    return mt_error(MT_ERR_OUT_OF_MEMORY,
                    "cudaMalloc of %s failed (%s) even after emptying the cache: meshtrain has "
                    "%s allocated in %zu block(s) and had %s cached in %zu block(s) (largest "
                    "cached block %s, %s released for the retry); %s", asked,
                    cudaGetErrorName(err), live, a->live.n, cached, cached_blocks_before, largest,
                    rel, gpu);
}

mt_status mt_cuda_alloc_get(mt_cuda_alloc *a, size_t bytes, void **out) {
    *out = NULL;
    size_t size = mt_block_round(bytes);
    if (!size) {
        char asked[32];
        return mt_error(MT_ERR_OUT_OF_MEMORY, "%s cannot hold %s: the size overflows", a->name,
                        mt_format_bytes(bytes, asked, sizeof asked));
    }
    cudaError_t err = cudaSetDevice(a->device);
    if (err != cudaSuccess) return cuda_error(a, err, "cudaSetDevice");

    pthread_mutex_lock(&a->lock);
    bool pending_fit = false;
    poll_fences(a);
    if (take_ready(a, size, out, &pending_fit)) goto done;
    if (pending_fit) {
        /* The GPU may well be idle: a fresh fence can complete at once. */
        record_fence(a);
        poll_fences(a);
        if (take_ready(a, size, out, &pending_fit)) goto done;
    }

    void *ptr = NULL;
    err = cudaMalloc(&ptr, size);
    if (err == cudaErrorMemoryAllocation) {
        clear_error();
        size_t cached_before = a->cache.bytes, cached_blocks = a->cache.n;
        size_t largest = mt_block_cache_largest(&a->cache);
        /* Wait for all work: then every cached block is free to reuse or release. */
        if (cudaDeviceSynchronize() == cudaSuccess) a->ready_seq = a->free_seq;
        else clear_error();
        if (take_ready(a, size, out, &pending_fit)) goto done;
        size_t released = release_ready(a);
        err = cudaMalloc(&ptr, size);
        if (err == cudaErrorMemoryAllocation) {
            clear_error();
            mt_status st = oom_error(a, size, err, cached_before, cached_blocks, largest,
                                     released);
            pthread_mutex_unlock(&a->lock);
            return st;
        }
    }
    if (err != cudaSuccess) {
        mt_status st = cuda_error(a, err, "cudaMalloc");
        pthread_mutex_unlock(&a->lock);
        return st;
    }
    a->mallocs++;
    if (!mt_block_live_add(&a->live, ptr, size)) {
        cudaFree(ptr);
        clear_error();
        pthread_mutex_unlock(&a->lock);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "%s: the host cannot grow the allocator's table",
                        a->name);
    }
    *out = ptr;
done:
    pthread_mutex_unlock(&a->lock);
    return MT_OK;
}

void mt_cuda_alloc_put(mt_cuda_alloc *a, void *ptr) {
    if (!ptr) return;
    if (cudaSetDevice(a->device) != cudaSuccess) clear_error();
    pthread_mutex_lock(&a->lock);
    size_t size = 0;
    if (!mt_block_live_remove(&a->live, ptr, &size)) {
        pthread_mutex_unlock(&a->lock);
        mt_log(MT_LOG_ERROR, "%s: freeing %p, which the caching allocator did not hand out; "
                             "ignoring it", a->name, ptr);
        return;
    }
    mt_cached_block b = {.ptr = ptr, .size = size, .freed_seq = ++a->free_seq};
    bool kept = a->cache.bytes <= a->cache_limit && size <= a->cache_limit - a->cache.bytes &&
                mt_block_cache_put(&a->cache, b);
    if (!kept) {
        /* cudaFree waits for the work that may still use the block. */
        cudaError_t err = cudaFree(ptr);
        if (err != cudaSuccess) {
            clear_error();
            mt_log(MT_LOG_WARN, "cudaFree on %s failed: %s", a->name, cudaGetErrorString(err));
        }
    }
    pthread_mutex_unlock(&a->lock);
}

void mt_cuda_alloc_all_done(mt_cuda_alloc *a) {
    pthread_mutex_lock(&a->lock);
    a->ready_seq = a->free_seq;
    pthread_mutex_unlock(&a->lock);
}

mt_status mt_cuda_alloc_track_stream(mt_cuda_alloc *a, cudaStream_t stream) {
    /* The marker event must belong to the stream's device. */
    if (cudaSetDevice(a->device) != cudaSuccess) clear_error();
    pthread_mutex_lock(&a->lock);
    bool ok = add_stream(a, stream);
    pthread_mutex_unlock(&a->lock);
    if (!ok)
        return mt_error(MT_ERR_SYSTEM, "%s: cannot make a marker event for a new stream",
                        a->name);
    return MT_OK;
}

void mt_cuda_alloc_untrack_stream(mt_cuda_alloc *a, cudaStream_t stream) {
    if (cudaSetDevice(a->device) != cudaSuccess) clear_error();
    pthread_mutex_lock(&a->lock);
    /* From 1: the default stream stays. */
    for (size_t i = 1; i < a->n_streams; i++) {
        if (a->streams[i].stream != stream) continue;
        /* Work still queued on the stream may use blocks freed already, and later fences no
         * longer look at it: join it into the fence stream once, so that every later fence waits
         * for it; if that fails, wait for it here. */
        tracked_stream *t = &a->streams[i];
        if (cudaEventRecord(t->marker, t->stream) != cudaSuccess ||
            cudaStreamWaitEvent(a->fence_stream, t->marker, 0) != cudaSuccess) {
            clear_error();
            if (cudaStreamSynchronize(t->stream) != cudaSuccess) clear_error();
        }
        cudaEventDestroy(t->marker);
        clear_error();
        a->streams[i] = a->streams[--a->n_streams];
        break;
    }
    pthread_mutex_unlock(&a->lock);
}

void mt_cuda_alloc_empty_cache(mt_cuda_alloc *a) {
    if (cudaSetDevice(a->device) != cudaSuccess) clear_error();
    pthread_mutex_lock(&a->lock);
    poll_fences(a);
    release_ready(a);
    pthread_mutex_unlock(&a->lock);
}

void mt_cuda_alloc_get_stats(mt_cuda_alloc *a, mt_cuda_alloc_stats *out) {
    pthread_mutex_lock(&a->lock);
    *out = (mt_cuda_alloc_stats){
        .live_bytes = a->live.bytes,
        .live_blocks = a->live.n,
        .cached_bytes = a->cache.bytes,
        .cached_blocks = a->cache.n,
        .largest_cached = mt_block_cache_largest(&a->cache),
        .mallocs = a->mallocs,
        .reuses = a->reuses,
    };
    pthread_mutex_unlock(&a->lock);
}
