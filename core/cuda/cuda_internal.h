/* Internal: the CUDA device's caching allocator and pinned host memory, for the CUDA backend and
 * for code that runs work on GPU memory outside mt_stream (NCCL, cuBLAS).
 *
 * Freed blocks are cached and handed out again without cudaFree/cudaMalloc. A block may still be
 * read or written by GPU work queued before its free, so it is reused only once that work is
 * known complete: a fence (events recorded on every stream the allocator knows, joined on an
 * internal stream) or a device synchronisation. The allocator knows the legacy default stream and
 * every stream made with mt_stream_create on the device; code that uses device memory on a
 * cudaStream_t of its own must register that stream (mt_cuda_device_track_stream) or synchronise
 * it before freeing the memory.
 */
#ifndef MT_CORE_CUDA_INTERNAL_H
#define MT_CORE_CUDA_INTERNAL_H

#include <meshtrain/device.h>
#include <meshtrain/dtype.h>

#include <cuda_runtime.h>

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_cuda_alloc mt_cuda_alloc;

typedef struct mt_cuda_alloc_stats {
    size_t live_bytes, live_blocks;     /* handed out, rounded sizes */
    size_t cached_bytes, cached_blocks; /* freed and kept */
    size_t largest_cached;
    uint64_t mallocs, reuses; /* cudaMalloc calls, requests served from the cache */
} mt_cuda_alloc_stats;

/* Creates the allocator of GPU device (the current device must be device). cache_limit bounds
 * the bytes kept cached (SIZE_MAX: no bound; 0: every free goes straight to cudaFree). name
 * ("cuda:0") is used in messages. */
mt_status mt_cuda_alloc_create(int device, const char *name, size_t cache_limit,
                               mt_cuda_alloc **out);
/* Releases the cache and the allocator's streams and events; blocks still live are not freed. */
void mt_cuda_alloc_destroy(mt_cuda_alloc *a);
/* At least bytes, aligned to 256; on failure the last error says what was asked, what is
 * allocated and cached, and the largest free block. */
mt_status mt_cuda_alloc_get(mt_cuda_alloc *a, size_t bytes, void **out);
void mt_cuda_alloc_put(mt_cuda_alloc *a, void *ptr);
/* Tells the allocator that all GPU work queued so far is complete (after a device sync). */
void mt_cuda_alloc_all_done(mt_cuda_alloc *a);
/* Adds/removes a stream that fences cover. Removing joins the work already queued on the stream
 * into the next fences, so the stream may be destroyed right after. */
mt_status mt_cuda_alloc_track_stream(mt_cuda_alloc *a, cudaStream_t stream);
void mt_cuda_alloc_untrack_stream(mt_cuda_alloc *a, cudaStream_t stream);
/* cudaFree of every cached block whose free is known complete. */
void mt_cuda_alloc_empty_cache(mt_cuda_alloc *a);
void mt_cuda_alloc_get_stats(mt_cuda_alloc *a, mt_cuda_alloc_stats *out);

/* The same for an open CUDA device (dev of kind MT_DEVICE_CUDA, not a CPU fallback); they return
 * MT_ERR_INVALID_ARG (stats: zeros) for any other device. */
mt_status mt_cuda_device_track_stream(mt_device *dev, cudaStream_t stream);
void mt_cuda_device_untrack_stream(mt_device *dev, cudaStream_t stream);
mt_status mt_cuda_device_alloc_stats(mt_device *dev, mt_cuda_alloc_stats *out);
mt_status mt_cuda_device_empty_cache(mt_device *dev);

/* x[i] *= factor on stream, in place, for f32 or bf16 (f32 arithmetic, one rounding to bf16):
 * the NCCL path's average where NCCL's own bf16 average would bias it (comm/nccl/nccl_coll.c).
 * Returns the launch's status. */
cudaError_t mt_cuda_scale_on_stream(void *x, mt_dtype dtype, size_t n, float factor,
                                    cudaStream_t stream);

/* Page-locked host memory for staging copies (cudaMallocHost): at least bytes; free with
 * mt_cuda_host_free (NULL is ignored). */
mt_status mt_cuda_host_alloc(size_t bytes, void **out);
void mt_cuda_host_free(void *ptr);

#ifdef __cplusplus
}
#endif

#endif
