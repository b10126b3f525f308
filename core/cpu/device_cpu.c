/* The CPU device: host memory. Work runs synchronously on the calling thread, so streams and
 * events only keep the ordering API usable (device.c validates their use). */
#include "core/device_internal.h"
#include "core/error.h"
#include "core/host_alloc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static mt_status cpu_alloc(mt_device *dev, size_t bytes, void **out) {
    errno = 0;
    void *ptr = mt_host_alloc(bytes, MT_DEVICE_ALIGNMENT);
    if (!ptr)
        return mt_error_errno(MT_ERR_OUT_OF_MEMORY, errno ? errno : ENOMEM,
                              "the host allocator refused it");
    *out = ptr;
    return MT_OK;
}

static void cpu_free(mt_device *dev, void *ptr) { free(ptr); }

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
    .close = NULL,
};

mt_status mt_cpu_device_init(mt_device *dev) {
    dev->ops = &cpu_ops;
    dev->backend = NULL;
    return MT_OK;
}
