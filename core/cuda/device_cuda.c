/* The CUDA device: GPU memory through the CUDA runtime and the caching allocator
 * (core/cuda/cuda_alloc.c). Plain C against cuda_runtime.h (no kernels here). The runtime's
 * current device is per thread, so every entry point selects the device first: the comm progress
 * thread and the compute thread may both call in. */
#include "core/cuda/cuda_internal.h"
#include "core/device_internal.h"
#include "core/env.h"
#include "core/error.h"

#include <meshtrain/log.h>
#include <meshtrain/memory.h>

#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static mt_status cuda_fail(const mt_device *dev, cudaError_t err, const char *what) {
    mt_status st = err == cudaErrorMemoryAllocation ? MT_ERR_OUT_OF_MEMORY : MT_ERR_SYSTEM;
    return mt_error(st, "%s on %s failed: %s (%s)", what, dev->name, cudaGetErrorString(err),
                    cudaGetErrorName(err));
}

#define CUDA_CHECK(dev, call, what)                                                                \
    do {                                                                                           \
        cudaError_t cuda_err_ = (call);                                                            \
        if (cuda_err_ != cudaSuccess) return cuda_fail((dev), cuda_err_, (what));                  \
    } while (0)

static mt_status select_device(const mt_device *dev) {
    CUDA_CHECK(dev, cudaSetDevice(dev->index), "cudaSetDevice");
    return MT_OK;
}

/* cudaSetDevice also makes the device's primary context current on the calling thread. */
static mt_status cuda_bind_thread(mt_device *dev) { return select_device(dev); }

static void warn_on_error(const mt_device *dev, cudaError_t err, const char *what) {
    if (err != cudaSuccess)
        mt_log(MT_LOG_WARN, "%s on %s failed: %s", what, dev->name, cudaGetErrorString(err));
}

static cudaStream_t native_stream(const mt_stream *stream) {
    return stream ? (cudaStream_t)stream->handle : (cudaStream_t)0;
}

static mt_status cuda_alloc(mt_device *dev, size_t bytes, void **out) {
    /* The allocator selects the device itself. cudaMalloc returns memory aligned to at least 256
     * bytes; cached blocks came from it. */
    return mt_cuda_alloc_get(dev->backend, bytes, out);
}

static void cuda_free(mt_device *dev, void *ptr) { mt_cuda_alloc_put(dev->backend, ptr); }

static enum cudaMemcpyKind native_copy_kind(mt_copy_kind kind) {
    switch (kind) {
    case MT_COPY_HOST_TO_DEVICE: return cudaMemcpyHostToDevice;
    case MT_COPY_DEVICE_TO_HOST: return cudaMemcpyDeviceToHost;
    case MT_COPY_DEVICE_TO_DEVICE: return cudaMemcpyDeviceToDevice;
    case MT_COPY_HOST_TO_HOST: return cudaMemcpyHostToHost;
    }
    return cudaMemcpyDefault;
}

static mt_status cuda_copy(mt_device *dev, void *dst, const void *src, size_t bytes,
                           mt_copy_kind kind, mt_stream *stream) {
    MT_TRY(select_device(dev));
    if (!stream) {
        CUDA_CHECK(dev, cudaMemcpy(dst, src, bytes, native_copy_kind(kind)), "cudaMemcpy");
        return MT_OK;
    }
    CUDA_CHECK(dev, cudaMemcpyAsync(dst, src, bytes, native_copy_kind(kind), native_stream(stream)),
               "cudaMemcpyAsync");
    return MT_OK;
}

static mt_status cuda_memset(mt_device *dev, void *dst, int value, size_t bytes,
                             mt_stream *stream) {
    MT_TRY(select_device(dev));
    CUDA_CHECK(dev, cudaMemsetAsync(dst, value, bytes, native_stream(stream)), "cudaMemsetAsync");
    /* Without a stream the call is synchronous, as mt_device_copy's is. */
    if (!stream) CUDA_CHECK(dev, cudaStreamSynchronize(0), "cudaStreamSynchronize");
    return MT_OK;
}

static mt_status cuda_synchronize(mt_device *dev) {
    MT_TRY(select_device(dev));
    CUDA_CHECK(dev, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    /* Every block freed so far is now safe to hand out again. */
    mt_cuda_alloc_all_done(dev->backend);
    return MT_OK;
}

static mt_status cuda_stream_create(mt_device *dev, mt_stream *stream) {
    MT_TRY(select_device(dev));
    cudaStream_t native;
    /* Non-blocking: a communication stream must not serialise with the legacy default stream. */
    CUDA_CHECK(dev, cudaStreamCreateWithFlags(&native, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    mt_status st = mt_cuda_alloc_track_stream(dev->backend, native);
    if (st != MT_OK) {
        cudaStreamDestroy(native);
        return st;
    }
    stream->handle = (void *)native;
    return MT_OK;
}

static void cuda_stream_destroy(mt_stream *stream) {
    if (select_device(stream->dev) != MT_OK) return;
    mt_cuda_alloc_untrack_stream(stream->dev->backend, native_stream(stream));
    warn_on_error(stream->dev, cudaStreamDestroy(native_stream(stream)), "cudaStreamDestroy");
}

static mt_status cuda_stream_synchronize(mt_stream *stream) {
    MT_TRY(select_device(stream->dev));
    CUDA_CHECK(stream->dev, cudaStreamSynchronize(native_stream(stream)), "cudaStreamSynchronize");
    return MT_OK;
}

static mt_status cuda_stream_wait_event(mt_stream *stream, mt_event *event) {
    MT_TRY(select_device(stream->dev));
    CUDA_CHECK(stream->dev,
               cudaStreamWaitEvent(native_stream(stream), (cudaEvent_t)event->handle, 0),
               "cudaStreamWaitEvent");
    return MT_OK;
}

static mt_status cuda_event_create(mt_device *dev, mt_event *event) {
    MT_TRY(select_device(dev));
    cudaEvent_t native;
    CUDA_CHECK(dev, cudaEventCreateWithFlags(&native, cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    event->handle = (void *)native;
    return MT_OK;
}

static void cuda_event_destroy(mt_event *event) {
    if (select_device(event->dev) != MT_OK) return;
    warn_on_error(event->dev, cudaEventDestroy((cudaEvent_t)event->handle), "cudaEventDestroy");
}

static mt_status cuda_event_record(mt_event *event, mt_stream *stream) {
    MT_TRY(select_device(event->dev));
    CUDA_CHECK(event->dev, cudaEventRecord((cudaEvent_t)event->handle, native_stream(stream)),
               "cudaEventRecord");
    return MT_OK;
}

static mt_status cuda_event_synchronize(mt_event *event) {
    MT_TRY(select_device(event->dev));
    CUDA_CHECK(event->dev, cudaEventSynchronize((cudaEvent_t)event->handle),
               "cudaEventSynchronize");
    return MT_OK;
}

static mt_status cuda_event_query(mt_event *event, bool *done) {
    MT_TRY(select_device(event->dev));
    cudaError_t err = cudaEventQuery((cudaEvent_t)event->handle);
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *done = false;
        return MT_OK;
    }
    if (err != cudaSuccess) return cuda_fail(event->dev, err, "cudaEventQuery");
    *done = true;
    return MT_OK;
}

static void cuda_close(mt_device *dev) {
    mt_cuda_alloc_destroy(dev->backend);
    dev->backend = NULL;
}

static const mt_device_ops cuda_ops = {
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .memset = cuda_memset,
    .synchronize = cuda_synchronize,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_synchronize = cuda_stream_synchronize,
    .stream_wait_event = cuda_stream_wait_event,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_synchronize = cuda_event_synchronize,
    .event_query = cuda_event_query,
    .close = cuda_close,
    .staging_alloc = mt_cuda_host_alloc,
    .staging_free = mt_cuda_host_free,
    .bind_thread = cuda_bind_thread,
};

void mt_cuda_device_count(int *count, char *why, size_t why_cap) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        *count = 0;
        snprintf(why, why_cap, "%s", cudaGetErrorString(err));
        return;
    }
    *count = n;
    if (n <= 0) snprintf(why, why_cap, "cudaGetDeviceCount reported no device");
    else snprintf(why, why_cap, "%d GPU(s)", n);
}

/* MT_CUDA_CACHE_BYTES bounds the bytes the caching allocator keeps; unset or empty: no bound, as
 * the cache is emptied before an allocation fails anyway; 0 turns caching off (e.g. for
 * compute-sanitizer, which sees reused blocks as valid). */
static mt_status cache_limit_from_env(const mt_device *dev, size_t *limit) {
    mt_status st = mt_env_bytes("MT_CUDA_CACHE_BYTES", 0, SIZE_MAX, SIZE_MAX,
                                "bytes the caching allocator keeps; 0 turns caching off", limit);
    return st == MT_OK ? MT_OK : mt_error_wrap(st, "cannot open %s", dev->name);
}

mt_status mt_cuda_device_init(mt_device *dev, int index) {
    dev->ops = &cuda_ops;
    dev->backend = NULL;
    size_t limit;
    MT_TRY(cache_limit_from_env(dev, &limit));
    MT_TRY(select_device(dev));
    /* Create the context now, so that the first allocation does not pay for it (and a broken
     * driver shows up at open, not in the middle of a step). */
    CUDA_CHECK(dev, cudaFree(NULL), "creating the CUDA context");
    struct cudaDeviceProp prop;
    CUDA_CHECK(dev, cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
    snprintf(dev->model, sizeof dev->model, "%s", prop.name);
    mt_cuda_alloc *alloc = NULL;
    MT_TRY(mt_cuda_alloc_create(index, dev->name, limit, &alloc));
    dev->backend = alloc;
    return MT_OK;
}

static mt_cuda_alloc *allocator_of(mt_device *dev) {
    if (!dev || dev->kind != MT_DEVICE_CUDA || dev->fallback || dev->ops != &cuda_ops) return NULL;
    return dev->backend;
}

static mt_status not_cuda(const char *what, const mt_device *dev) {
    return mt_error(MT_ERR_INVALID_ARG, "%s: %s is not a CUDA device", what,
                    dev ? dev->name : "(no device)");
}

mt_status mt_cuda_device_track_stream(mt_device *dev, cudaStream_t stream) {
    mt_cuda_alloc *a = allocator_of(dev);
    if (!a) return not_cuda("mt_cuda_device_track_stream", dev);
    return mt_cuda_alloc_track_stream(a, stream);
}

void mt_cuda_device_untrack_stream(mt_device *dev, cudaStream_t stream) {
    mt_cuda_alloc *a = allocator_of(dev);
    if (a) mt_cuda_alloc_untrack_stream(a, stream);
}

mt_status mt_cuda_device_alloc_stats(mt_device *dev, mt_cuda_alloc_stats *out) {
    mt_cuda_alloc *a = allocator_of(dev);
    if (!a) {
        *out = (mt_cuda_alloc_stats){0};
        return not_cuda("mt_cuda_device_alloc_stats", dev);
    }
    mt_cuda_alloc_get_stats(a, out);
    return MT_OK;
}

mt_status mt_cuda_device_empty_cache(mt_device *dev) {
    mt_cuda_alloc *a = allocator_of(dev);
    if (!a) return not_cuda("mt_cuda_device_empty_cache", dev);
    mt_cuda_alloc_empty_cache(a);
    return MT_OK;
}
