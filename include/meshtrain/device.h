/* The device interface: where a rank's tensors live and compute runs.
 *
 * CPU device: host memory, with an optional capacity (MT_CPU_DEVICE_MEMORY, e.g. "2GiB") so that
 * running out of memory is real and testable. CUDA device: compiled when the CUDA toolkit is
 * present; on a machine without a GPU, opening it falls back to the CPU device with a one-line
 * notice. Every allocation is charged to a memory category (see memory.h).
 */
#ifndef MESHTRAIN_DEVICE_H
#define MESHTRAIN_DEVICE_H

#include <meshtrain/api.h>
#include <meshtrain/memory.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_device_kind { MT_DEVICE_CPU = 0, MT_DEVICE_CUDA = 1 } mt_device_kind;

typedef struct mt_device mt_device;
typedef struct mt_stream mt_stream;
typedef struct mt_event mt_event;

/* Direction of a copy between host memory and a device's memory. */
typedef enum mt_copy_kind {
    MT_COPY_HOST_TO_DEVICE,
    MT_COPY_DEVICE_TO_HOST,
    MT_COPY_DEVICE_TO_DEVICE,
    MT_COPY_HOST_TO_HOST
} mt_copy_kind;

/* Opens a device. kind MT_DEVICE_CUDA with index i picks GPU i; without CUDA support or without a
 * GPU it opens the CPU device instead and logs a one-line notice. The CPU device's capacity comes
 * from MT_CPU_DEVICE_MEMORY (unset or empty: unlimited); a malformed value is an error naming it.
 * The CPU device has one index, 0: for MT_DEVICE_CPU any non-negative index opens it. */
MT_API mt_status mt_device_open(mt_device_kind kind, int index, mt_device **out);

/* Opens a CPU device with an explicit capacity in bytes (0 = unlimited), ignoring the env. */
MT_API mt_status mt_device_open_cpu(size_t capacity, mt_device **out);

/* The number of CUDA GPUs this process can use: 0 in a build without CUDA or on a machine without
 * a GPU or driver, and then why (may be NULL) receives the reason. */
MT_API int mt_device_cuda_count(char *why, size_t why_cap);

/* Closes the device. Memory still allocated is reported as a leak at warn level (bytes per
 * category), then released. */
MT_API void mt_device_close(mt_device *dev);

MT_API mt_device_kind mt_device_get_kind(const mt_device *dev);
MT_API int mt_device_index(const mt_device *dev);

/* "cpu" or "cuda:N". */
MT_API const char *mt_device_name(const mt_device *dev);

/* The hardware: the GPU's name as CUDA reports it ("NVIDIA H200"), or "cpu". */
MT_API const char *mt_device_model(const mt_device *dev);

/* True when the device was asked for CUDA but fell back to the CPU. */
MT_API bool mt_device_is_fallback(const mt_device *dev);

/* Allocates bytes charged to category. Zero bytes gives a valid unique pointer. Exceeding the
 * capacity returns MT_ERR_OUT_OF_MEMORY with a message containing "out of memory", the category,
 * the size asked and what is left. Memory is aligned to 256 bytes. */
MT_API
mt_status mt_device_alloc(mt_device *dev, size_t bytes, mt_mem_category category, void **out);

/* Frees memory from mt_device_alloc (NULL is ignored). */
MT_API void mt_device_free(mt_device *dev, void *ptr);

/* Copies bytes. With a stream the copy may be asynchronous; NULL means the default stream and
 * returns when the copy is done. */
MT_API mt_status mt_device_copy(mt_device *dev, void *dst, const void *src, size_t bytes,
                                mt_copy_kind kind, mt_stream *stream);

/* Sets bytes of device memory to value. */
MT_API
mt_status mt_device_memset(mt_device *dev, void *dst, int value, size_t bytes, mt_stream *stream);

/* Waits until all work queued on the device is done. */
MT_API mt_status mt_device_synchronize(mt_device *dev);

/* Current and peak bytes per category, and the capacity. */
MT_API void mt_device_mem_stats(const mt_device *dev, mt_mem_stats *out);

/* Writes the rank's memory report into buf: one line per category with current and peak bytes,
 * then the total and the capacity ("params  1.00 MiB (peak 2.00 MiB)", ...). Returns buf. */
MT_API const char *mt_memory_report(const mt_device *dev, char *buf, size_t size);

/* Resets the peaks to the current values (e.g. between benchmark phases). */
MT_API void mt_device_reset_peaks(mt_device *dev);

/* The stream the compute ops (ops.h) are queued on, for a CUDA kernel of your own that must run
 * in order with them. On a CUDA device every op, and every copy or memset given no mt_stream, is
 * queued on the legacy default stream, and *cuda_stream receives NULL: the cudaStream_t 0, which
 * names that stream unless your code is compiled with --default-stream per-thread (then pass
 * cudaStreamLegacy). A kernel launched on it, after cudaSetDevice(mt_device_index(dev)), runs after
 * the ops queued before it and before those queued after it; memory it uses may be given back with
 * mt_device_free as soon as it is queued, as for an op. A kernel on a stream of your own is
 * ordered with the ops only through events (cudaEventRecord on one stream, cudaStreamWaitEvent on
 * the other, both ways), and memory it uses must stay allocated until it has finished (the
 * allocator cannot see that stream). On the CPU device *cuda_stream receives NULL too: there is no
 * stream, ops run synchronously and are done when they return. */
MT_API mt_status mt_device_compute_stream(mt_device *dev, void **cuda_stream);

/* Streams and events order work on one device (CPU: work runs synchronously, so they are
 * ordering no-ops that still validate their use). */
MT_API mt_status mt_stream_create(mt_device *dev, mt_stream **out);
MT_API void mt_stream_destroy(mt_stream *stream);
MT_API mt_status mt_stream_synchronize(mt_stream *stream);
MT_API mt_status mt_stream_wait_event(mt_stream *stream, mt_event *event);

MT_API mt_status mt_event_create(mt_device *dev, mt_event **out);
MT_API void mt_event_destroy(mt_event *event);
MT_API mt_status mt_event_record(mt_event *event, mt_stream *stream);
MT_API mt_status mt_event_synchronize(mt_event *event);
/* done is set to true when the work before the record has completed. */
MT_API mt_status mt_event_query(mt_event *event, bool *done);

#ifdef __cplusplus
}
#endif
#endif
