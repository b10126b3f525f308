/* Internal: the device object and the small table of operations a backend implements.
 *
 * core/device.c owns what is common to every backend: argument checks, the accounting of every
 * live allocation (size and category per pointer, current and peak per category, the capacity
 * check), leak reports, and the stream/event objects. A backend (core/cpu, core/cuda) only moves
 * bytes and wraps its native streams and events.
 */
#ifndef MT_CORE_DEVICE_INTERNAL_H
#define MT_CORE_DEVICE_INTERNAL_H

#include "core/host_tier.h"

#include <meshtrain/device.h>

#include <pthread.h>
#include <stdint.h>

/* Alignment of every device allocation. */
#define MT_DEVICE_ALIGNMENT 256

typedef struct mt_device_ops {
    /* Allocates at least bytes (> 0) aligned to MT_DEVICE_ALIGNMENT. On failure sets the last
     * error with what the backend knows (e.g. the GPU's free memory) and returns its status. */
    mt_status (*alloc)(mt_device *dev, size_t bytes, void **out);
    void (*free)(mt_device *dev, void *ptr);
    /* stream is NULL or belongs to dev; NULL means synchronous. */
    mt_status (*copy)(mt_device *dev, void *dst, const void *src, size_t bytes, mt_copy_kind kind,
                      mt_stream *stream);
    mt_status (*memset)(mt_device *dev, void *dst, int value, size_t bytes, mt_stream *stream);
    mt_status (*synchronize)(mt_device *dev);
    /* Fill or release the native handle of an already validated stream/event. */
    mt_status (*stream_create)(mt_device *dev, mt_stream *stream);
    void (*stream_destroy)(mt_stream *stream);
    mt_status (*stream_synchronize)(mt_stream *stream);
    mt_status (*stream_wait_event)(mt_stream *stream, mt_event *event);
    mt_status (*event_create)(mt_device *dev, mt_event *event);
    void (*event_destroy)(mt_event *event);
    mt_status (*event_record)(mt_event *event, mt_stream *stream);
    mt_status (*event_synchronize)(mt_event *event);
    mt_status (*event_query)(mt_event *event, bool *done);
    /* Releases the backend state (after every block was freed). */
    void (*close)(mt_device *dev);
    /* Host memory that copies to and from the device are fastest with (page-locked on a GPU);
     * NULL: ordinary host memory (mt_host_alloc). */
    mt_status (*staging_alloc)(size_t bytes, void **out);
    void (*staging_free)(void *ptr);
    /* Makes dev the calling thread's current device, for threads that hand device memory to
     * another library (the offload stager's UCX thread: cuda_copy works in the thread's current
     * context). NULL: nothing to do (the CPU device). */
    mt_status (*bind_thread)(mt_device *dev);
} mt_device_ops;

/* One live allocation in the accounting table. ptr == NULL marks an empty slot. */
typedef struct mt_alloc_entry {
    void *ptr;
    size_t bytes;
    mt_mem_category category;
} mt_alloc_entry;

struct mt_device {
    const mt_device_ops *ops;
    void *backend; /* backend state */
    mt_device_kind kind;
    int index;
    bool fallback;
    char name[32];
    char model[96]; /* "NVIDIA H200", or "cpu" */

    /* Guards stats and the table: the comm progress thread allocates too. */
    pthread_mutex_t lock;
    mt_mem_stats stats;
    mt_alloc_entry *table; /* open addressing, linear probing, power-of-two size */
    size_t table_cap;
    size_t table_used;

    mt_host_tier host; /* host memory beside the device (core/host_tier.c) */
};

struct mt_stream {
    mt_device *dev;
    void *handle; /* native stream (cudaStream_t), NULL on CPU */
};

struct mt_event {
    mt_device *dev;
    void *handle; /* native event (cudaEvent_t), NULL on CPU */
    bool recorded;
};

/* dev->ops->bind_thread where the backend has one, else MT_OK. */
mt_status mt_device_bind_thread(mt_device *dev);

/* CPU backend: sets up dev->ops and dev->backend. */
mt_status mt_cpu_device_init(mt_device *dev);

#ifdef MT_HAVE_CUDA
/* Number of usable GPUs; on failure returns the CUDA error string in why and sets *count = 0. */
void mt_cuda_device_count(int *count, char *why, size_t why_cap);
/* CUDA backend for GPU index (valid): sets up dev->ops and dev->backend. */
mt_status mt_cuda_device_init(mt_device *dev, int index);
#endif

/* Whether [ptr, ptr + bytes) lies inside one live allocation of dev's allocator
 * (mt_device_alloc): the device's own answer to "is this device memory". Takes dev->lock. */
bool mt_device_contains(mt_device *dev, const void *ptr, size_t bytes);

/* Charges (releases) memory the device's allocator did not hand out but that lives on the device,
 * e.g. what NCCL allocates for its communicators (measured around their creation), so that the
 * accounting and its peaks cover it. No capacity check: the memory is already taken. */
void mt_device_charge_external(mt_device *dev, mt_mem_category category, size_t bytes);
void mt_device_release_external(mt_device *dev, mt_mem_category category, size_t bytes);

/* "params 900.00 MiB, grads 12.00 MiB" for the categories in use, or "nothing". */
void mt_mem_format_in_use(const mt_mem_stats *s, char *buf, size_t cap);
/* Appends one line per category (current, peak), then the total and the capacity, to a report
 * of len characters so far; returns the new length. */
size_t mt_mem_report_lines(const mt_mem_stats *s, char *buf, size_t size, size_t len);

/* Per-category accounting shared by the device's allocator and its host tier (core/host_tier.c);
 * the caller holds the lock that guards s. mt_mem_reserve charges bytes to category when the
 * capacity (0 = unlimited) allows and returns true; otherwise it charges nothing, writes "asked
 * <bytes> for <category>, <left> left of <capacity> (<capacity_note>in use: ...)" into why and
 * returns false. The peaks move only through mt_mem_commit_peaks, once the memory is really
 * held, with the values read right after the charge. */
void mt_mem_charge(mt_mem_stats *s, mt_mem_category category, size_t bytes);
bool mt_mem_reserve(mt_mem_stats *s, mt_mem_category category, size_t bytes,
                    const char *capacity_note, char *why, size_t why_cap);
void mt_mem_commit_peaks(mt_mem_stats *s, mt_mem_category category, size_t category_now,
                         size_t total_now);
void mt_mem_uncharge(mt_mem_stats *s, mt_mem_category category, size_t bytes);
void mt_mem_reset_peaks(mt_mem_stats *s);

#endif
