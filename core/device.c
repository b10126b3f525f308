/* Device dispatch and memory accounting, common to every backend.
 *
 * Each live allocation is kept in a small open-addressing table (pointer -> size, category):
 * a header in front of each block would not work for GPU memory, which the host cannot read.
 * The capacity is reserved under the lock before the backend allocates, so two threads cannot
 * both squeeze into the last free bytes.
 */
#include "core/device_internal.h"
#include "core/env.h"
#include "core/error.h"

#include <meshtrain/log.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TABLE_INITIAL_CAP 64

/* ---- the allocation table (callers hold dev->lock) ------------------------------------------- */

static size_t hash_ptr(const void *ptr, size_t cap) {
    uint64_t x = (uint64_t)(uintptr_t)ptr;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static void table_put(mt_alloc_entry *table, size_t cap, mt_alloc_entry entry) {
    size_t i = hash_ptr(entry.ptr, cap);
    while (table[i].ptr) i = (i + 1) & (cap - 1);
    table[i] = entry;
}

static bool table_grow(mt_device *dev) {
    size_t cap = dev->table_cap ? dev->table_cap * 2 : TABLE_INITIAL_CAP;
    mt_alloc_entry *table = calloc(cap, sizeof *table);
    if (!table) return false;
    for (size_t i = 0; i < dev->table_cap; i++)
        if (dev->table[i].ptr) table_put(table, cap, dev->table[i]);
    free(dev->table);
    dev->table = table;
    dev->table_cap = cap;
    return true;
}

static bool table_insert(mt_device *dev, mt_alloc_entry entry) {
    /* Keep the load under one half so that probe runs stay short. */
    if ((dev->table_used + 1) * 2 > dev->table_cap && !table_grow(dev)) return false;
    table_put(dev->table, dev->table_cap, entry);
    dev->table_used++;
    return true;
}

static bool table_remove(mt_device *dev, const void *ptr, mt_alloc_entry *removed) {
    if (!dev->table_cap) return false;
    size_t mask = dev->table_cap - 1;
    size_t i = hash_ptr(ptr, dev->table_cap);
    while (dev->table[i].ptr != ptr) {
        if (!dev->table[i].ptr) return false;
        i = (i + 1) & mask;
    }
    *removed = dev->table[i];
    /* Backward-shift deletion: pull later entries of the probe run into the hole so that lookups
     * never stop early, without tombstones. */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; dev->table[j].ptr; j = (j + 1) & mask) {
        size_t home = hash_ptr(dev->table[j].ptr, dev->table_cap);
        bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            dev->table[hole] = dev->table[j];
            hole = j;
        }
    }
    dev->table[hole].ptr = NULL;
    dev->table_used--;
    return true;
}

bool mt_device_contains(mt_device *dev, const void *ptr, size_t bytes) {
    if (!dev || !ptr) return false;
    uintptr_t a = (uintptr_t)ptr;
    bool found = false;
    /* A linear scan: the table is keyed by start pointer, and a range may start inside an
     * allocation. Only registration asks, which is rare and costs far more anyway. */
    pthread_mutex_lock(&dev->lock);
    for (size_t i = 0; i < dev->table_cap && !found; i++) {
        const mt_alloc_entry *e = &dev->table[i];
        uintptr_t base = (uintptr_t)e->ptr;
        found = e->ptr && a >= base && a - base <= e->bytes && bytes <= e->bytes - (a - base);
    }
    pthread_mutex_unlock(&dev->lock);
    return found;
}

/* ---- accounting (callers hold dev->lock) ----------------------------------------------------- */

/* Charges a reservation; the peaks move only once the backend allocation succeeds (see
 * mt_mem_commit_peaks), so that a request the host refuses leaves no trace in them. */
void mt_mem_charge(mt_mem_stats *s, mt_mem_category category, size_t bytes) {
    s->current[category] += bytes;
    s->total_current += bytes;
}

bool mt_mem_reserve(mt_mem_stats *s, mt_mem_category category, size_t bytes,
                    const char *capacity_note, char *why, size_t why_cap) {
    /* Memory charged from outside (mt_device_charge_external) may already exceed the capacity. */
    size_t left_bytes = s->capacity > s->total_current ? s->capacity - s->total_current : 0;
    if (s->capacity && bytes > left_bytes) {
        char asked[32], left[32], cap[32], in_use[512];
        mt_mem_format_in_use(s, in_use, sizeof in_use);
        snprintf(why, why_cap, "asked %s for %s, %s left of %s (%sin use: %s)",
                 mt_format_bytes(bytes, asked, sizeof asked), mt_mem_category_name(category),
                 mt_format_bytes(left_bytes, left, sizeof left),
                 mt_format_bytes(s->capacity, cap, sizeof cap), capacity_note, in_use);
        return false;
    }
    mt_mem_charge(s, category, bytes);
    return true;
}

void mt_mem_commit_peaks(mt_mem_stats *s, mt_mem_category category, size_t category_now,
                         size_t total_now) {
    if (category_now > s->peak[category]) s->peak[category] = category_now;
    if (total_now > s->total_peak) s->total_peak = total_now;
}

void mt_mem_uncharge(mt_mem_stats *s, mt_mem_category category, size_t bytes) {
    s->current[category] -= bytes;
    s->total_current -= bytes;
}

void mt_mem_reset_peaks(mt_mem_stats *s) {
    for (int c = 0; c < MT_MEM_CATEGORY_COUNT; c++) s->peak[c] = s->current[c];
    s->total_peak = s->total_current;
}

void mt_mem_format_in_use(const mt_mem_stats *s, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int c = 0; c < MT_MEM_CATEGORY_COUNT && used < cap; c++) {
        if (!s->current[c]) continue;
        char amount[32];
        int n = snprintf(buf + used, cap - used, "%s%s %s", used ? ", " : "",
                         mt_mem_category_name((mt_mem_category)c),
                         mt_format_bytes(s->current[c], amount, sizeof amount));
        if (n > 0) used += (size_t)n;
    }
    if (!buf[0]) snprintf(buf, cap, "nothing");
}

size_t mt_mem_report_lines(const mt_mem_stats *s, char *buf, size_t size, size_t len) {
    char now[32], peak[32];
    for (int c = 0; c < MT_MEM_CATEGORY_COUNT && len < size; c++)
        len += (size_t)snprintf(buf + len, size - len, "  %-12s %12s  (peak %s)\n",
                                mt_mem_category_name((mt_mem_category)c),
                                mt_format_bytes(s->current[c], now, sizeof now),
                                mt_format_bytes(s->peak[c], peak, sizeof peak));
    if (len < size)
        len += (size_t)snprintf(buf + len, size - len, "  %-12s %12s  (peak %s)", "total",
                                mt_format_bytes(s->total_current, now, sizeof now),
                                mt_format_bytes(s->total_peak, peak, sizeof peak));
    if (len < size && s->capacity)
        len += (size_t)snprintf(buf + len, size - len, ", capacity %s",
                                mt_format_bytes(s->capacity, now, sizeof now));
    return len < size ? len : (size ? size - 1 : 0);
}

/* ---- opening and closing --------------------------------------------------------------------- */

static mt_status device_new(mt_device **out) {
    mt_device *dev = calloc(1, sizeof *dev);
    if (!dev) return mt_error(MT_ERR_OUT_OF_MEMORY, "cannot allocate a device object");
    int rc = pthread_mutex_init(&dev->lock, NULL);
    if (rc) {
        free(dev);
        return mt_error_errno(MT_ERR_SYSTEM, rc, "cannot create the device's lock");
    }
    mt_status st = mt_host_tier_init(&dev->host);
    if (st != MT_OK) {
        pthread_mutex_destroy(&dev->lock);
        free(dev);
        return st;
    }
    *out = dev;
    return MT_OK;
}

static void device_delete(mt_device *dev) {
    pthread_mutex_destroy(&dev->lock);
    pthread_mutex_destroy(&dev->host.lock);
    free(dev->host.blocks);
    free(dev->table);
    free(dev);
}

static mt_status open_cpu(size_t capacity, mt_device **out) {
    mt_device *dev = NULL;
    MT_TRY(device_new(&dev));
    dev->kind = MT_DEVICE_CPU;
    dev->index = 0;
    snprintf(dev->name, sizeof dev->name, "cpu");
    snprintf(dev->model, sizeof dev->model, "cpu");
    dev->stats.capacity = capacity;
    mt_status st = mt_cpu_device_init(dev);
    if (st != MT_OK) {
        device_delete(dev);
        return st;
    }
    *out = dev;
    return MT_OK;
}

/* MT_CPU_DEVICE_MEMORY: unset or empty means unlimited. */
static mt_status capacity_from_env(size_t *capacity) {
    mt_status st = mt_env_bytes("MT_CPU_DEVICE_MEMORY", 0, SIZE_MAX, 0,
                                "the CPU device's capacity; 0 or unset: unlimited", capacity);
    return st == MT_OK ? MT_OK : mt_error_wrap(st, "cannot open the cpu device");
}

mt_status mt_device_open_cpu(size_t capacity, mt_device **out) {
    if (!out) return mt_error(MT_ERR_INVALID_ARG, "mt_device_open_cpu: out must not be NULL");
    *out = NULL;
    return open_cpu(capacity, out);
}

#ifdef MT_HAVE_CUDA
static mt_status open_cuda(int index, mt_device **out) {
    mt_device *dev = NULL;
    MT_TRY(device_new(&dev));
    dev->kind = MT_DEVICE_CUDA;
    dev->index = index;
    snprintf(dev->name, sizeof dev->name, "cuda:%d", index);
    mt_status st = mt_cuda_device_init(dev, index);
    if (st != MT_OK) {
        device_delete(dev);
        return st;
    }
    *out = dev;
    return MT_OK;
}
#endif

mt_status mt_device_open(mt_device_kind kind, int index, mt_device **out) {
    if (!out) return mt_error(MT_ERR_INVALID_ARG, "mt_device_open: out must not be NULL");
    *out = NULL;
    if (kind != MT_DEVICE_CPU && kind != MT_DEVICE_CUDA)
        return mt_error(MT_ERR_INVALID_ARG, "mt_device_open: unknown device kind %d", (int)kind);
    if (index < 0)
        return mt_error(MT_ERR_INVALID_ARG, "mt_device_open: device index %d is negative", index);
    size_t capacity;
    if (kind == MT_DEVICE_CPU) {
        MT_TRY(capacity_from_env(&capacity));
        return open_cpu(capacity, out);
    }

    char why[256];
    int count = mt_device_cuda_count(why, sizeof why);
    if (count > 0) {
        if (index >= count)
            return mt_error(MT_ERR_NOT_FOUND,
                            "cannot open cuda:%d: the index is out of range, this machine has %d "
                            "GPU(s) (cuda:0 .. cuda:%d)", index, count, count - 1);
#ifdef MT_HAVE_CUDA
        return open_cuda(index, out);
#endif
    }
    MT_TRY(capacity_from_env(&capacity));
    MT_TRY(open_cpu(capacity, out));
    (*out)->fallback = true;
    mt_log(MT_LOG_WARN, "no CUDA GPU found (%s); falling back to the CPU device", why);
    return MT_OK;
}

int mt_device_cuda_count(char *why, size_t why_cap) {
    char scratch[256];
    if (!why) {
        why = scratch;
        why_cap = sizeof scratch;
    }
    why[0] = '\0';
#ifdef MT_HAVE_CUDA
    int count = 0;
    mt_cuda_device_count(&count, why, why_cap);
    return count;
#else
    snprintf(why, why_cap, "this meshtrain build has no CUDA support");
    return 0;
#endif
}

void mt_device_close(mt_device *dev) {
    if (!dev) return;
    if (dev->table_used) {
        char in_use[512], total[32];
        mt_mem_format_in_use(&dev->stats, in_use, sizeof in_use);
        /* After an error that ended the program early, blocks left behind are expected: the
         * error is what the user needs to read, not a leak report. */
        mt_log(mt_failure_pending(NULL, NULL, 0) ? MT_LOG_INFO : MT_LOG_WARN,
               "closing %s with %zu block(s) still allocated, %s in all (%s); "
               "releasing them", dev->name, dev->table_used,
               mt_format_bytes(dev->stats.total_current, total, sizeof total), in_use);
        /* The device owns its memory: nothing can reach it once the device is gone. */
        for (size_t i = 0; i < dev->table_cap; i++)
            if (dev->table[i].ptr) dev->ops->free(dev, dev->table[i].ptr);
    }
    /* Host blocks first: on a GPU they are pinned through the backend, which close releases. */
    mt_host_tier_close(dev);
    if (dev->ops->close) dev->ops->close(dev);
    device_delete(dev);
}

mt_device_kind mt_device_get_kind(const mt_device *dev) { return dev ? dev->kind : MT_DEVICE_CPU; }

int mt_device_index(const mt_device *dev) { return dev ? dev->index : -1; }

const char *mt_device_name(const mt_device *dev) { return dev ? dev->name : "(no device)"; }

const char *mt_device_model(const mt_device *dev) { return dev ? dev->model : "(no device)"; }

bool mt_device_is_fallback(const mt_device *dev) { return dev && dev->fallback; }

/* ---- memory ---------------------------------------------------------------------------------- */

mt_status mt_device_alloc(mt_device *dev, size_t bytes, mt_mem_category category, void **out) {
    if (!dev || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_device_alloc: dev and out must not be NULL");
    *out = NULL;
    if ((unsigned)category >= MT_MEM_CATEGORY_COUNT)
        return mt_error(MT_ERR_INVALID_ARG, "mt_device_alloc on %s: unknown memory category %d",
                        dev->name, (int)category);

    char asked[32], why[768];
    pthread_mutex_lock(&dev->lock);
    if (!mt_mem_reserve(&dev->stats, category, bytes, "", why, sizeof why)) {
        pthread_mutex_unlock(&dev->lock);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "out of memory on %s: %s", dev->name, why);
    }
    size_t category_now = dev->stats.current[category], total_now = dev->stats.total_current;
    pthread_mutex_unlock(&dev->lock);

    /* Zero bytes still gets a block of its own so that the pointer is unique and freeable. */
    void *ptr = NULL;
    mt_status st = dev->ops->alloc(dev, bytes ? bytes : 1, &ptr);
    if (st != MT_OK) {
        pthread_mutex_lock(&dev->lock);
        mt_mem_uncharge(&dev->stats, category, bytes);
        pthread_mutex_unlock(&dev->lock);
        return mt_error_wrap(st, "%s on %s: asked %s for %s",
                             st == MT_ERR_OUT_OF_MEMORY ? "out of memory" : "allocation failed",
                             dev->name, mt_format_bytes(bytes, asked, sizeof asked),
                             mt_mem_category_name(category));
    }

    pthread_mutex_lock(&dev->lock);
    bool recorded = table_insert(dev, (mt_alloc_entry){ptr, bytes, category});
    if (recorded) mt_mem_commit_peaks(&dev->stats, category, category_now, total_now);
    else mt_mem_uncharge(&dev->stats, category, bytes);
    pthread_mutex_unlock(&dev->lock);
    if (!recorded) {
        dev->ops->free(dev, ptr);
        return mt_error(MT_ERR_OUT_OF_MEMORY,
                        "out of memory on %s: asked %s for %s, but the host could not grow the "
                        "allocation table", dev->name,
                        mt_format_bytes(bytes, asked, sizeof asked),
                        mt_mem_category_name(category));
    }
    *out = ptr;
    return MT_OK;
}

void mt_device_free(mt_device *dev, void *ptr) {
    if (!ptr) return;
    if (!dev) {
        mt_log(MT_LOG_ERROR, "mt_device_free(%p) without a device; ignoring it", ptr);
        return;
    }
    mt_alloc_entry entry;
    pthread_mutex_lock(&dev->lock);
    bool found = table_remove(dev, ptr, &entry);
    if (found) mt_mem_uncharge(&dev->stats, entry.category, entry.bytes);
    pthread_mutex_unlock(&dev->lock);
    if (!found) {
        mt_log(MT_LOG_ERROR, "mt_device_free on %s: %p was not allocated by this device or was "
                             "already freed; ignoring it", dev->name, ptr);
        return;
    }
    dev->ops->free(dev, ptr);
}

const char *mt_memory_report(const mt_device *dev, char *buf, size_t size) {
    if (!buf || size == 0) return buf;
    buf[0] = '\0';
    if (!dev) return buf;
    mt_mem_stats s;
    mt_device_mem_stats(dev, &s);
    size_t len = (size_t)snprintf(buf, size, "memory of %s:\n", dev->name);
    len = mt_mem_report_lines(&s, buf, size, len);
    if (len < size) mt_host_tier_report(&dev->host, buf, size, len);
    return buf;
}

void mt_device_charge_external(mt_device *dev, mt_mem_category category, size_t bytes) {
    if (!dev || (unsigned)category >= MT_MEM_CATEGORY_COUNT) return;
    pthread_mutex_lock(&dev->lock);
    mt_mem_charge(&dev->stats, category, bytes);
    mt_mem_commit_peaks(&dev->stats, category, dev->stats.current[category],
                        dev->stats.total_current);
    pthread_mutex_unlock(&dev->lock);
}

void mt_device_release_external(mt_device *dev, mt_mem_category category, size_t bytes) {
    if (!dev || (unsigned)category >= MT_MEM_CATEGORY_COUNT) return;
    pthread_mutex_lock(&dev->lock);
    size_t charged = dev->stats.current[category];
    mt_mem_uncharge(&dev->stats, category, bytes < charged ? bytes : charged);
    pthread_mutex_unlock(&dev->lock);
    if (bytes > charged) {
        /* A caller's bookkeeping is off: say so rather than let the counters wrap. */
        char asked[32], have[32];
        mt_log(MT_LOG_WARN, "%s: releasing %s of external %s memory, but only %s is charged",
               dev->name, mt_format_bytes(bytes, asked, sizeof asked),
               mt_mem_category_name(category), mt_format_bytes(charged, have, sizeof have));
    }
}

void mt_device_mem_stats(const mt_device *dev, mt_mem_stats *out) {
    if (!out) return;
    if (!dev) {
        memset(out, 0, sizeof *out);
        return;
    }
    /* The lock is not part of the device's observable state. */
    pthread_mutex_t *lock = (pthread_mutex_t *)&dev->lock;
    pthread_mutex_lock(lock);
    *out = dev->stats;
    pthread_mutex_unlock(lock);
}

void mt_device_reset_peaks(mt_device *dev) {
    if (!dev) return;
    pthread_mutex_lock(&dev->lock);
    mt_mem_reset_peaks(&dev->stats);
    pthread_mutex_unlock(&dev->lock);
    mt_host_tier_reset_peaks(&dev->host);
}

/* ---- copies ---------------------------------------------------------------------------------- */

static mt_status check_stream(const char *what, mt_device *dev, mt_stream *stream) {
    if (stream && stream->dev != dev)
        return mt_error(MT_ERR_INVALID_ARG, "%s on %s: the stream belongs to %s", what, dev->name,
                        stream->dev->name);
    return MT_OK;
}

mt_status mt_device_copy(mt_device *dev, void *dst, const void *src, size_t bytes,
                         mt_copy_kind kind, mt_stream *stream) {
    if (!dev) return mt_error(MT_ERR_INVALID_ARG, "mt_device_copy: dev must not be NULL");
    if (kind < MT_COPY_HOST_TO_DEVICE || kind > MT_COPY_HOST_TO_HOST)
        return mt_error(MT_ERR_INVALID_ARG, "mt_device_copy on %s: unknown copy kind %d",
                        dev->name, (int)kind);
    MT_TRY(check_stream("mt_device_copy", dev, stream));
    if (!bytes) return MT_OK;
    if (!dst || !src)
        return mt_error(MT_ERR_INVALID_ARG, "mt_device_copy on %s: %s is NULL for a copy of %zu "
                                            "bytes", dev->name, dst ? "src" : "dst", bytes);
    return dev->ops->copy(dev, dst, src, bytes, kind, stream);
}

mt_status mt_device_memset(mt_device *dev, void *dst, int value, size_t bytes, mt_stream *stream) {
    if (!dev) return mt_error(MT_ERR_INVALID_ARG, "mt_device_memset: dev must not be NULL");
    MT_TRY(check_stream("mt_device_memset", dev, stream));
    if (!bytes) return MT_OK;
    if (!dst)
        return mt_error(MT_ERR_INVALID_ARG, "mt_device_memset on %s: dst is NULL for %zu bytes",
                        dev->name, bytes);
    return dev->ops->memset(dev, dst, value, bytes, stream);
}

mt_status mt_device_synchronize(mt_device *dev) {
    if (!dev) return mt_error(MT_ERR_INVALID_ARG, "mt_device_synchronize: dev must not be NULL");
    return dev->ops->synchronize(dev);
}

mt_status mt_device_bind_thread(mt_device *dev) {
    return dev->ops->bind_thread ? dev->ops->bind_thread(dev) : MT_OK;
}

/* ---- streams and events ---------------------------------------------------------------------- */

mt_status mt_device_compute_stream(mt_device *dev, void **cuda_stream) {
    if (!dev || !cuda_stream)
        return mt_error(MT_ERR_INVALID_ARG, "mt_device_compute_stream: %s must not be NULL",
                        dev ? "cuda_stream" : "dev");
    /* NULL on both kinds, and no backend entry for it: the CUDA ops launch without a stream
     * (MT_CUDA_LAUNCH, core/cuda/ops_cuda.h) and the cuBLAS handles keep their default stream, so
     * the compute stream is the legacy default one, whose handle is 0. Should the ops move to a
     * stream of their own, this must return it. */
    *cuda_stream = NULL;
    return MT_OK;
}

mt_status mt_stream_create(mt_device *dev, mt_stream **out) {
    if (!dev || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_stream_create: dev and out must not be NULL");
    *out = NULL;
    mt_stream *stream = calloc(1, sizeof *stream);
    if (!stream)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "cannot allocate a stream object for %s", dev->name);
    stream->dev = dev;
    mt_status st = dev->ops->stream_create(dev, stream);
    if (st != MT_OK) {
        free(stream);
        return st;
    }
    *out = stream;
    return MT_OK;
}

void mt_stream_destroy(mt_stream *stream) {
    if (!stream) return;
    stream->dev->ops->stream_destroy(stream);
    free(stream);
}

mt_status mt_stream_synchronize(mt_stream *stream) {
    if (!stream)
        return mt_error(MT_ERR_INVALID_ARG, "mt_stream_synchronize: stream must not be NULL");
    return stream->dev->ops->stream_synchronize(stream);
}

mt_status mt_stream_wait_event(mt_stream *stream, mt_event *event) {
    if (!stream || !event)
        return mt_error(MT_ERR_INVALID_ARG,
                        "mt_stream_wait_event: stream and event must not be NULL");
    if (stream->dev != event->dev)
        return mt_error(MT_ERR_INVALID_ARG,
                        "mt_stream_wait_event: the stream is on %s but the event is on %s",
                        stream->dev->name, event->dev->name);
    /* Like CUDA: waiting for an event that was never recorded does nothing. */
    if (!event->recorded) return MT_OK;
    return stream->dev->ops->stream_wait_event(stream, event);
}

mt_status mt_event_create(mt_device *dev, mt_event **out) {
    if (!dev || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_event_create: dev and out must not be NULL");
    *out = NULL;
    mt_event *event = calloc(1, sizeof *event);
    if (!event)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "cannot allocate an event object for %s", dev->name);
    event->dev = dev;
    mt_status st = dev->ops->event_create(dev, event);
    if (st != MT_OK) {
        free(event);
        return st;
    }
    *out = event;
    return MT_OK;
}

void mt_event_destroy(mt_event *event) {
    if (!event) return;
    event->dev->ops->event_destroy(event);
    free(event);
}

mt_status mt_event_record(mt_event *event, mt_stream *stream) {
    if (!event) return mt_error(MT_ERR_INVALID_ARG, "mt_event_record: event must not be NULL");
    if (stream && stream->dev != event->dev)
        return mt_error(MT_ERR_INVALID_ARG,
                        "mt_event_record: the event is on %s but the stream is on %s",
                        event->dev->name, stream->dev->name);
    MT_TRY(event->dev->ops->event_record(event, stream));
    event->recorded = true;
    return MT_OK;
}

mt_status mt_event_synchronize(mt_event *event) {
    if (!event)
        return mt_error(MT_ERR_INVALID_ARG, "mt_event_synchronize: event must not be NULL");
    if (!event->recorded) return MT_OK;
    return event->dev->ops->event_synchronize(event);
}

mt_status mt_event_query(mt_event *event, bool *done) {
    if (!event || !done)
        return mt_error(MT_ERR_INVALID_ARG, "mt_event_query: event and done must not be NULL");
    if (!event->recorded) {
        *done = true;
        return MT_OK;
    }
    return event->dev->ops->event_query(event, done);
}
