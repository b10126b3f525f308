/* Staging copies over UCX (include/meshtrain/stage.h, comm/host/stage.h).
 *
 * Which path a stager takes, decided once in mt_stager_create (mt_stager_path tells):
 *   - CPU device: UCX (MT_STAGE_PATH_UCX), host memory on both sides, whatever UCX it runs with.
 *   - CUDA device, and the UCX loaded at run time reports CUDA among its memory types
 *     (ucp_context_query, UCP_ATTR_FIELD_MEMORY_TYPES: a UCX built with CUDA whose cuda_copy
 *     module loaded, e.g. PyPI's libucx-cu13 through MT_UCX_ROOT): UCX too. Device buffers are
 *     registered with ucp_mem_map as UCS_MEMORY_TYPE_CUDA, host-tier blocks as
 *     UCS_MEMORY_TYPE_HOST, and each ucp_get_nbx names its local buffer's memory type
 *     (UCP_OP_ATTR_FIELD_MEMORY_TYPE); UCX moves the bytes with cuda_copy (or gdr_copy). The
 *     staging thread and the registering thread make the device current first, as cuda_copy
 *     works in the calling thread's CUDA context.
 *   - CUDA device and a UCX without CUDA (Debian's 1.13): MT_STAGE_PATH_DEVICE_COPY,
 *     cudaMemcpyAsync on a stream of the stager's own, with one warning per process naming the
 *     UCX. No UCX context is kept then.
 * The decision is the run-time UCX's, not the headers': the same binary takes the UCX path when
 * it loads a CUDA-enabled libucp and the fallback when it loads another.
 *
 * Why ucp_get_nbx: a get completes when the bytes are in the local (destination) buffer, so its
 * callback is the copy's completion; a put's callback only says that the source may be reused,
 * and remote completion would need a flush per copy. The endpoint goes to the stager's own
 * worker, so UCX picks its loopback transports (self, shared memory), or cuda_copy for CUDA
 * memory when it has it.
 */
#include "comm/host/stage.h"

#include "core/device_internal.h"
#include "core/error.h"
#include "core/thread_name.h"

#include <meshtrain/host_memory.h>
#include <meshtrain/log.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

const char *mt_stage_path_name(mt_stage_path path) {
    return path == MT_STAGE_PATH_UCX ? "ucx" : "device-copy";
}

mt_stage_path mt_stager_path(const mt_stager *stager) {
    return stager ? stager->path : MT_STAGE_PATH_UCX;
}

void mt_stager_get_stats(mt_stager *st, mt_stager_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    *out = st->stats;
    out->handles_pooled = st->pooled;
    out->pool_limit = MT_STAGE_HANDLE_POOL;
    pthread_mutex_unlock(&st->mu);
}

static mt_status ucs_fail(ucs_status_t s, const char *call, const char *why) {
    return mt_error(MT_ERR_COMM, "cannot set up offload staging: UCX %s failed: %s (%s)", call,
                    ucs_status_string(s), why);
}

/* ---- the staging thread ---------------------------------------------------------------------- */

static void finish(mt_stager *st, mt_stage_copy *c, ucs_status_t s) {
    pthread_mutex_lock(&st->mu);
    if (s != UCS_OK) {
        c->status = MT_ERR_COMM;
        snprintf(c->error, sizeof c->error, "offload staging copy of %zu bytes from %p to %p "
                 "failed: UCX ucp_get_nbx: %s%s", c->bytes, c->src, c->dst, ucs_status_string(s),
                 c->inject_fail ? " (injected by MT_TEST_STAGE_COPY_FAIL=1)" : "");
    }
    for (int i = 0; i < 2; i++)
        if (c->regions[i]) c->regions[i]->inflight--;
    c->done = true;
    pthread_cond_broadcast(&st->done_cv);
    pthread_mutex_unlock(&st->mu);
}

static void get_done(void *request, ucs_status_t status, void *user_data) {
    mt_stage_copy *c = user_data;
    c->stager->inflight--;
    finish(c->stager, c, status);
    ucp_request_free(request);
}

static void post(mt_stager *st, mt_stage_copy *c) {
    if (c->inject_fail) {
        finish(st, c, UCS_ERR_IO_ERROR);
        return;
    }
    ucp_request_param_t param;
    memset(&param, 0, sizeof param);
    /* The memory type saves UCX a lookup of the local buffer (its memtype cache or a driver
     * call) per copy; the memh already says where the buffer lies. */
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.cb.send = get_done;
    param.user_data = c;
    param.memh = c->dst_memh;
    param.memory_type = c->dst_mem_type;
    void *req = ucp_get_nbx(st->self_ep, c->dst, c->bytes, (uint64_t)(uintptr_t)c->src,
                            c->src_rkey, &param);
    if (req == NULL) {
        finish(st, c, UCS_OK);
    } else if (UCS_PTR_IS_ERR(req)) {
        finish(st, c, UCS_PTR_STATUS(req));
    } else {
        st->inflight++;
    }
}

static void *stage_thread(void *arg) {
    mt_name_this_thread("mt-offload");
    mt_stager *st = arg;
    /* UCX's cuda_copy copies in the posting thread's current CUDA context. */
    mt_status bound = mt_device_bind_thread(st->dev);
    pthread_mutex_lock(&st->mu);
    st->thread_status = bound;
    if (bound != MT_OK) snprintf(st->thread_error, sizeof st->thread_error, "%s", mt_last_error());
    st->thread_ready = true;
    pthread_cond_broadcast(&st->done_cv);
    if (bound != MT_OK) {
        pthread_mutex_unlock(&st->mu);
        return NULL;
    }
    for (;;) {
        mt_stage_copy *batch = st->queue_head;
        st->queue_head = st->queue_tail = NULL;
        if (!batch && st->inflight == 0) {
            if (st->stop) break;
            pthread_cond_wait(&st->work_cv, &st->mu);
            continue;
        }
        pthread_mutex_unlock(&st->mu);
        while (batch) {
            mt_stage_copy *next = batch->next;
            post(st, batch);
            batch = next;
        }
        /* Busy progress while copies are in flight: they are large and the thread has nothing
         * else to do; it sleeps on work_cv once they are done. */
        while (ucp_worker_progress(st->worker)) {
        }
        pthread_mutex_lock(&st->mu);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* ---- creating and destroying ----------------------------------------------------------------- */

static mt_status open_ucx(mt_stager *st) {
    ucp_config_t *config;
    ucs_status_t s = ucp_config_read(NULL, NULL, &config);
    if (s != UCS_OK) return ucs_fail(s, "ucp_config_read", "check the UCX_* variables");
    ucp_params_t params;
    memset(&params, 0, sizeof params);
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_RMA;
    params.mt_workers_shared = 1;
    s = ucp_init(&params, config, &st->ctx);
    ucp_config_release(config);
    if (s != UCS_OK) return ucs_fail(s, "ucp_init", "check the UCX_* variables, e.g. UCX_TLS");

    if (st->dev->kind == MT_DEVICE_CUDA) {
        ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
        s = ucp_context_query(st->ctx, &attr);
        if (s != UCS_OK) return ucs_fail(s, "ucp_context_query", "the memory types it supports");
        if (!(attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA))) {
            static atomic_flag told = ATOMIC_FLAG_INIT;
            if (!atomic_flag_test_and_set(&told))
                mt_log(MT_LOG_WARN, "offload staging: this UCX (%s) has no CUDA transports; "
                       "device<->host copies use cudaMemcpyAsync on a stream instead (a UCX "
                       "built with CUDA, e.g. PyPI's libucx-cu13, stages through UCX)",
                       ucp_get_version_string());
            ucp_cleanup(st->ctx);
            st->ctx = NULL;
            st->path = MT_STAGE_PATH_DEVICE_COPY;
            return mt_stream_create(st->dev, &st->stream);
        }
    }

    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_MULTI;
    s = ucp_worker_create(st->ctx, &wp, &st->worker);
    if (s != UCS_OK) return ucs_fail(s, "ucp_worker_create", "the staging worker");
    ucp_worker_attr_t wattr = {.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE};
    s = ucp_worker_query(st->worker, &wattr);
    if (s != UCS_OK) return ucs_fail(s, "ucp_worker_query", "the staging worker's thread mode");
    if (wattr.thread_mode != UCS_THREAD_MODE_MULTI)
        return mt_error(MT_ERR_COMM, "cannot set up offload staging: this UCX (%s) gives no "
                        "multi-threaded worker (was it built without --enable-mt?)",
                        ucp_get_version_string());

    ucp_address_t *addr;
    size_t addr_len;
    s = ucp_worker_get_address(st->worker, &addr, &addr_len);
    if (s != UCS_OK) return ucs_fail(s, "ucp_worker_get_address", "the staging worker");
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = addr;
    s = ucp_ep_create(st->worker, &ep, &st->self_ep);
    ucp_worker_release_address(st->worker, addr);
    if (s != UCS_OK) return ucs_fail(s, "ucp_ep_create", "the endpoint to the staging worker");
    return MT_OK;
}

void mt_stager_inject_copy_failure(mt_stager *st, bool on) {
    atomic_store(&st->inject_copy_fail, on);
}

mt_status mt_stager_create(mt_device *dev, mt_stager **out) {
    if (!dev || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_stager_create: dev and out must not be NULL");
    *out = NULL;
    mt_stager *st = calloc(1, sizeof *st);
    if (!st) return mt_error(MT_ERR_OUT_OF_MEMORY, "cannot allocate a stager");
    st->dev = dev;
    /* Read once here, not per copy (getenv scans environ and races a concurrent setenv). */
    const char *inject = getenv("MT_TEST_STAGE_COPY_FAIL");
    atomic_init(&st->inject_copy_fail, inject && strcmp(inject, "1") == 0);
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->work_cv, NULL);
    pthread_cond_init(&st->done_cv, NULL);
    mt_status s = open_ucx(st);
    if (s == MT_OK && st->path == MT_STAGE_PATH_UCX) {
        int rc = pthread_create(&st->thread, NULL, stage_thread, st);
        if (rc) s = mt_error_errno(MT_ERR_SYSTEM, rc, "cannot start the offload staging thread");
        st->thread_started = rc == 0;
    }
    if (st->thread_started) {
        pthread_mutex_lock(&st->mu);
        while (!st->thread_ready) pthread_cond_wait(&st->done_cv, &st->mu);
        pthread_mutex_unlock(&st->mu);
        if (st->thread_status != MT_OK)
            s = mt_error(st->thread_status, "cannot set up offload staging on %s: the staging "
                         "thread cannot use the device: %s", dev->name, st->thread_error);
    }
    if (s != MT_OK) {
        mt_stager_destroy(st);
        return s;
    }
    *out = st;
    return MT_OK;
}

static void close_self_ep(mt_stager *st) {
    ucp_request_param_t param;
    memset(&param, 0, sizeof param);
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void *req = ucp_ep_close_nbx(st->self_ep, &param);
    if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(st->worker);
        ucp_request_free(req);
    }
}

static void region_release(mt_stager *st, mt_stage_region *r) {
    if (r->rkey) ucp_rkey_destroy(r->rkey);
    if (r->memh) ucp_mem_unmap(st->ctx, r->memh);
    free(r);
}

void mt_stager_destroy(mt_stager *st) {
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    size_t handles = st->handles;
    pthread_mutex_unlock(&st->mu);
    if (handles) {
        /* Each handle points at the stager (its lock, its regions): freeing it would leave them
         * dangling, and the library must not crash later in the caller's mt_stage_wait. Refused,
         * and left in place (leaked) so that those waits still work. */
        mt_log(MT_LOG_ERROR, "mt_stager_destroy: %zu staging cop%s on %s never given to "
               "mt_stage_wait; the stager is left in place (leaked) so that %s stay%s valid: "
               "wait for every copy before destroying it", handles, handles == 1 ? "y" : "ies",
               st->dev->name, handles == 1 ? "it" : "they", handles == 1 ? "s" : "");
        return;
    }
    if (st->thread_started) {
        pthread_mutex_lock(&st->mu);
        st->stop = true;
        pthread_cond_signal(&st->work_cv);
        pthread_mutex_unlock(&st->mu);
        /* The thread leaves once the queue is empty and nothing is in flight. */
        pthread_join(st->thread, NULL);
    }
    for (size_t i = 0; i < st->region_count; i++) region_release(st, st->regions[i]);
    free(st->regions);
    while (st->pool) {
        mt_stage_copy *next = st->pool->next;
        if (st->pool->event) mt_event_destroy(st->pool->event);
        free(st->pool);
        st->pool = next;
    }
    if (st->self_ep) close_self_ep(st);
    if (st->worker) ucp_worker_destroy(st->worker);
    if (st->ctx) ucp_cleanup(st->ctx);
    if (st->stream) {
        /* The device-copy path's copies in flight finish before their stream goes. */
        if (mt_stream_synchronize(st->stream) != MT_OK)
            mt_log(MT_LOG_WARN, "offload staging: waiting for copies in flight on %s failed: %s",
                   st->dev->name, mt_last_error());
        mt_stream_destroy(st->stream);
    }
    pthread_cond_destroy(&st->done_cv);
    pthread_cond_destroy(&st->work_cv);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* ---- regions --------------------------------------------------------------------------------- */

/* Under mu. The region holding [p, p + bytes), or NULL. */
static mt_stage_region *find_region(mt_stager *st, const void *p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < st->region_count; i++) {
        mt_stage_region *r = st->regions[i];
        if (a >= r->base && a - r->base <= r->bytes && bytes <= r->bytes - (a - r->base))
            return r;
    }
    return NULL;
}

static mt_status mem_map_failed(mt_stager *st, ucs_status_t s, void *ptr, size_t bytes,
                                bool injected) {
    struct rlimit lim;
    char limit[32] = "unknown", asked[32];
    if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
        if (lim.rlim_cur == RLIM_INFINITY) snprintf(limit, sizeof limit, "unlimited");
        else mt_format_bytes((size_t)lim.rlim_cur, limit, sizeof limit);
    }
    return mt_error(MT_ERR_COMM, "cannot register %s at %p on %s for offload staging: UCX "
                    "ucp_mem_map failed: %s%s. Registration pins memory: check the locked-memory "
                    "limit (RLIMIT_MEMLOCK, now %s; raise it with `ulimit -l unlimited`) and the "
                    "UCX_TLS / UCX_MEMTYPE_* settings, or stage smaller shards",
                    mt_format_bytes(bytes, asked, sizeof asked), ptr, st->dev->name,
                    ucs_status_string(s), injected ? " (injected by MT_TEST_UCX_MEM_MAP_FAIL=1)"
                                                   : "", limit);
}

/* Maps the region and unpacks its rkey on the self endpoint (the worker is MULTI). */
static mt_status map_region(mt_stager *st, mt_stage_region *r, void *ptr, size_t bytes) {
    const char *fail = getenv("MT_TEST_UCX_MEM_MAP_FAIL");
    if (fail && strcmp(fail, "1") == 0) return mem_map_failed(st, UCS_ERR_NO_MEMORY, ptr, bytes, true);
    /* mt_stager_register accepted only host-tier blocks and the device's own allocations. */
    bool on_device = st->dev->kind == MT_DEVICE_CUDA && mt_device_contains(st->dev, ptr, bytes);
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof mp);
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.address = ptr;
    mp.length = bytes;
    r->mem_type = on_device ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    mp.memory_type = r->mem_type;
    /* UCX registers CUDA memory in the calling thread's current context. */
    if (on_device) MT_TRY(mt_device_bind_thread(st->dev));
    ucs_status_t s = ucp_mem_map(st->ctx, &mp, &r->memh);
    if (s != UCS_OK) return mem_map_failed(st, s, ptr, bytes, false);
    void *packed;
    size_t packed_len;
    s = ucp_rkey_pack(st->ctx, r->memh, &packed, &packed_len);
    if (s == UCS_OK) {
        s = ucp_ep_rkey_unpack(st->self_ep, packed, &r->rkey);
        ucp_rkey_buffer_release(packed);
    }
    if (s != UCS_OK)
        return mt_error(MT_ERR_COMM, "cannot register %zu bytes at %p for offload staging: UCX "
                        "ucp_rkey_pack / ucp_ep_rkey_unpack failed: %s", bytes, ptr,
                        ucs_status_string(s));
    return MT_OK;
}

/* Under mu. An error naming the registered region that [ptr, ptr + bytes) overlaps, or MT_OK. */
static mt_status refuse_overlap(mt_stager *st, void *ptr, size_t bytes) {
    uintptr_t a = (uintptr_t)ptr;
    for (size_t i = 0; i < st->region_count; i++) {
        mt_stage_region *r = st->regions[i];
        if (a < r->base + r->bytes && r->base < a + bytes)
            return mt_error(MT_ERR_INVALID_ARG, "mt_stager_register: %zu bytes at %p overlap the "
                            "registered region of %zu bytes at %p", bytes, ptr, r->bytes,
                            (void *)r->base);
    }
    return MT_OK;
}

mt_status mt_stager_register(mt_stager *st, void *ptr, size_t bytes) {
    if (!st || !ptr || !bytes)
        return mt_error(MT_ERR_INVALID_ARG, "mt_stager_register: stager and ptr must not be NULL "
                        "and bytes must not be 0");
    uintptr_t a = (uintptr_t)ptr;
    if (a + bytes < a)
        return mt_error(MT_ERR_INVALID_ARG, "mt_stager_register: %zu bytes at %p wrap around",
                        bytes, ptr);
    /* On a CUDA device, whatever is not in the host tier used to be mapped as CUDA memory: a
     * malloc'ed buffer then failed in ucp_mem_map with a misleading RLIMIT_MEMLOCK message (or
     * worse, on the device-copy path, was copied as device memory). Only the two kinds the
     * stager knows are accepted. On the CPU device all memory is host memory. */
    if (st->dev->kind == MT_DEVICE_CUDA && !mt_host_tier_contains(st->dev, ptr, bytes) &&
        !mt_device_contains(st->dev, ptr, bytes))
        return mt_error(MT_ERR_INVALID_ARG, "mt_stager_register: %zu bytes at %p are neither a "
                        "host-tier block of %s (mt_host_tier_alloc) nor device memory of it "
                        "(mt_device_alloc): the stager copies only between those", bytes, ptr,
                        st->dev->name);
    pthread_mutex_lock(&st->mu);
    mt_status s = refuse_overlap(st, ptr, bytes);
    pthread_mutex_unlock(&st->mu);
    if (s != MT_OK) return s;

    mt_stage_region *r = calloc(1, sizeof *r);
    if (!r) return mt_error(MT_ERR_OUT_OF_MEMORY, "cannot allocate a staging region");
    r->base = a;
    r->bytes = bytes;
    s = st->path == MT_STAGE_PATH_UCX ? map_region(st, r, ptr, bytes) : MT_OK;
    pthread_mutex_lock(&st->mu);
    /* The check above ran before the (slow, unlocked) mapping: another thread may have
     * registered an overlapping region meanwhile. Checked again where the append happens; the
     * loser's mapping is released below. */
    if (s == MT_OK) s = refuse_overlap(st, ptr, bytes);
    if (s == MT_OK && st->region_count == st->region_cap) {
        size_t cap = st->region_cap ? st->region_cap * 2 : 16;
        mt_stage_region **grown = realloc(st->regions, cap * sizeof *grown);
        if (grown) {
            st->regions = grown;
            st->region_cap = cap;
        } else {
            s = mt_error(MT_ERR_OUT_OF_MEMORY, "cannot grow the staging region table");
        }
    }
    if (s == MT_OK) st->regions[st->region_count++] = r;
    pthread_mutex_unlock(&st->mu);
    if (s != MT_OK) region_release(st, r);
    return s;
}

mt_status mt_stager_unregister(mt_stager *st, void *ptr) {
    if (!st || !ptr)
        return mt_error(MT_ERR_INVALID_ARG, "mt_stager_unregister: stager and ptr must not be "
                        "NULL");
    pthread_mutex_lock(&st->mu);
    mt_stage_region *r = NULL;
    size_t i = 0;
    for (; i < st->region_count; i++)
        if (st->regions[i]->base == (uintptr_t)ptr) {
            r = st->regions[i];
            break;
        }
    mt_status s = MT_OK;
    if (!r) {
        s = mt_error(MT_ERR_INVALID_ARG, "mt_stager_unregister: no registered region starts at "
                     "%p", ptr);
    } else if (r->inflight) {
        s = mt_error(MT_ERR_INVALID_ARG, "mt_stager_unregister: %d staging cop%s into or out "
                     "of the region at %p still in flight: wait for them first", r->inflight,
                     r->inflight == 1 ? "y is" : "ies are", ptr);
    } else {
        st->regions[i] = st->regions[--st->region_count];
    }
    pthread_mutex_unlock(&st->mu);
    if (s == MT_OK) region_release(st, r);
    return s;
}

/* ---- copies ---------------------------------------------------------------------------------- */

/* A zeroed handle: from the stager's pool, else malloc'd (counted). */
static mt_stage_copy *handle_get(mt_stager *st) {
    pthread_mutex_lock(&st->mu);
    mt_stage_copy *c = st->pool;
    if (c) {
        st->pool = c->next;
        st->pooled--;
    }
    pthread_mutex_unlock(&st->mu);
    if (c) {
        mt_event *keep = c->event; /* recorded again by the next device copy */
        memset(c, 0, sizeof *c);
        c->event = keep;
        return c;
    }
    c = calloc(1, sizeof *c);
    if (c) {
        pthread_mutex_lock(&st->mu);
        st->stats.handles_allocated++;
        pthread_mutex_unlock(&st->mu);
    }
    return c;
}

/* Under mu. Back to the pool while it has room; freed otherwise. */
static void handle_put(mt_stager *st, mt_stage_copy *c) {
    if (st->pooled >= MT_STAGE_HANDLE_POOL) {
        if (c->event) mt_event_destroy(c->event);
        free(c);
        return;
    }
    c->next = st->pool;
    st->pool = c;
    st->pooled++;
}

/* The handle's event is created with the handle's first device copy and recorded again by
 * every later one: a steady stream of copies creates no events (docs/offload.md). */
static mt_status start_device_copy(mt_stager *st, mt_stage_copy *c, mt_copy_kind kind) {
    c->on_device = true;
    if (!c->event) {
        MT_TRY(mt_event_create(st->dev, &c->event));
        pthread_mutex_lock(&st->mu);
        st->events_created++;
        pthread_mutex_unlock(&st->mu);
    }
    MT_TRY(mt_device_copy(st->dev, c->dst, c->src, c->bytes, kind, st->stream));
    return mt_event_record(c->event, st->stream);
}

mt_status mt_stage_copy_async(mt_stager *st, void *dst, const void *src, size_t bytes,
                              mt_copy_kind kind, mt_stage_copy **out) {
    if (!st || !out || ((!dst || !src) && bytes))
        return mt_error(MT_ERR_INVALID_ARG, "mt_stage_copy_async: stager, out, dst and src must "
                        "not be NULL");
    *out = NULL;
    if (kind != MT_COPY_HOST_TO_DEVICE && kind != MT_COPY_DEVICE_TO_HOST)
        return mt_error(MT_ERR_INVALID_ARG, "mt_stage_copy_async: kind must be "
                        "MT_COPY_HOST_TO_DEVICE or MT_COPY_DEVICE_TO_HOST");
    mt_stage_copy *c = handle_get(st);
    if (!c) return mt_error(MT_ERR_OUT_OF_MEMORY, "cannot allocate a staging copy");
    c->stager = st;
    c->dst = dst;
    c->src = src;
    c->bytes = bytes;
    c->inject_fail = atomic_load(&st->inject_copy_fail);
    if (bytes == 0) {
        c->done = true;
        pthread_mutex_lock(&st->mu);
        st->handles++;
        st->stats.copies++;
        pthread_mutex_unlock(&st->mu);
        *out = c;
        return MT_OK;
    }
    pthread_mutex_lock(&st->mu);
    mt_stage_region *rd = find_region(st, dst, bytes), *rs = find_region(st, src, bytes);
    if (!rd || !rs) {
        handle_put(st, c);
        pthread_mutex_unlock(&st->mu);
        return mt_error(MT_ERR_INVALID_ARG, "mt_stage_copy_async of %zu bytes: the %s range at %p "
                        "is not inside one registered region (mt_stager_register the block "
                        "first)", bytes, rd ? "source" : "destination", rd ? src : dst);
    }
    rd->inflight++;
    rs->inflight++;
    c->regions[0] = rd;
    c->regions[1] = rs;
    c->dst_memh = rd->memh;
    c->dst_mem_type = rd->mem_type;
    c->src_rkey = rs->rkey;
    st->stats.copies++;
    if (st->path == MT_STAGE_PATH_UCX) {
        if (st->queue_tail) st->queue_tail->next = c;
        else st->queue_head = c;
        st->queue_tail = c;
        st->handles++;
        pthread_cond_signal(&st->work_cv);
        pthread_mutex_unlock(&st->mu);
        *out = c;
        return MT_OK;
    }
    st->handles++; /* taken back below if the copy does not start */
    pthread_mutex_unlock(&st->mu);
    mt_status s = start_device_copy(st, c, kind);
    if (s != MT_OK) {
        pthread_mutex_lock(&st->mu);
        rd->inflight--;
        rs->inflight--;
        st->handles--;
        st->stats.copies--;
        handle_put(st, c);
        pthread_mutex_unlock(&st->mu);
        return s;
    }
    *out = c;
    return MT_OK;
}

/* The device-copy path: the event says when; publishes done like the staging thread does. A
 * failed query or synchronize is the copy's failure, kept in c for mt_stage_test / wait. */
static void poll_event(mt_stage_copy *c, bool wait) {
    bool done = false;
    mt_status s = wait ? mt_event_synchronize(c->event) : mt_event_query(c->event, &done);
    if (wait && s == MT_OK) done = true;
    if (s != MT_OK) {
        done = true;
        snprintf(c->error, sizeof c->error, "%s", mt_last_error());
    }
    if (!done) return;
    pthread_mutex_lock(&c->stager->mu);
    c->status = s;
    for (int i = 0; i < 2; i++)
        if (c->regions[i]) c->regions[i]->inflight--;
    c->regions[0] = c->regions[1] = NULL;
    c->done = true;
    pthread_mutex_unlock(&c->stager->mu);
}

static mt_status copy_status(mt_stage_copy *c) {
    return c->status == MT_OK ? MT_OK : mt_error(c->status, "%s", c->error);
}

mt_status mt_stage_test(mt_stage_copy *c, bool *done) {
    if (!c || !done)
        return mt_error(MT_ERR_INVALID_ARG, "mt_stage_test: copy and done must not be NULL");
    mt_stager *st = c->stager;
    if (c->on_device && !c->done) poll_event(c, false);
    pthread_mutex_lock(&st->mu);
    *done = c->done;
    pthread_mutex_unlock(&st->mu);
    return *done ? copy_status(c) : MT_OK;
}

mt_status mt_stage_wait(mt_stage_copy *c) {
    if (!c) return mt_error(MT_ERR_INVALID_ARG, "mt_stage_wait: copy must not be NULL");
    mt_stager *st = c->stager;
    if (c->on_device && !c->done) poll_event(c, true);
    pthread_mutex_lock(&st->mu);
    if (!c->done) st->stats.waits++;
    while (!c->done) pthread_cond_wait(&st->done_cv, &st->mu);
    pthread_mutex_unlock(&st->mu);
    mt_status s = copy_status(c);
    /* Counted out last: from here a destroy may free the stager (and its pool with c). */
    pthread_mutex_lock(&st->mu);
    st->handles--;
    handle_put(st, c);
    pthread_mutex_unlock(&st->mu);
    return s;
}
