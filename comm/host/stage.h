/* Internal: the staging engine's objects (include/meshtrain/stage.h, comm/host/stage.c).
 *
 * Threading: the worker is created UCS_THREAD_MODE_MULTI because user threads register regions
 * (ucp_mem_map, ucp_ep_rkey_unpack) while the staging thread posts and progresses copies; UCX's
 * lock costs nothing next to copies of shards. Copies are queued under mu, posted by the staging
 * thread (so that the bytes move on that thread, not the caller's: the self transport copies
 * inside ucp_get_nbx), and published done under mu with done_cv broadcast. */
#ifndef MT_COMM_HOST_STAGE_H
#define MT_COMM_HOST_STAGE_H

#include <meshtrain/stage.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

typedef struct mt_stage_region {
    uintptr_t base;
    size_t bytes;
    ucp_mem_h memh;      /* NULL on the device-copy path */
    ucp_rkey_h rkey;     /* unpacked on the stager's self endpoint */
    ucs_memory_type_t mem_type; /* what ucp_mem_map was told: host, or cuda for device memory */
    int inflight;        /* copies using it (under mu) */
} mt_stage_region;

struct mt_stage_copy {
    mt_stager *stager;
    void *dst;
    const void *src;
    size_t bytes;
    ucp_mem_h dst_memh;
    ucs_memory_type_t dst_mem_type; /* the local buffer's, for ucp_get_nbx */
    ucp_rkey_h src_rkey;
    mt_stage_region *regions[2]; /* dst, src: their inflight counts drop when done */
    mt_event *event;             /* device-copy path: created once, kept with the pooled handle */
    bool on_device;              /* this copy went through the device-copy path */
    bool done;                   /* under mu */
    mt_status status;            /* under mu, once done */
    char error[256];             /* what failed, once done with an error */
    bool inject_fail;            /* MT_TEST_STAGE_COPY_FAIL=1 when it started: fails on the thread */
    struct mt_stage_copy *next;  /* queue link, then free-list link once waited for */
};

/* Free handles kept per stager for reuse (a copy per shard per step would otherwise malloc on
 * the hot path); handles beyond it are freed when waited for. */
#define MT_STAGE_HANDLE_POOL 64

struct mt_stager {
    mt_device *dev;
    mt_stage_path path;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h self_ep;

    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* the thread waits for copies */
    pthread_cond_t done_cv; /* waiters wait for completions */
    mt_stage_region **regions;
    size_t region_count, region_cap;
    mt_stage_copy *queue_head, *queue_tail;
    int inflight; /* posted, not completed (staging thread) */
    size_t handles; /* handed out by mt_stage_copy_async, not yet given to mt_stage_wait */
    mt_stage_copy *pool; /* free handles (under mu), at most MT_STAGE_HANDLE_POOL */
    size_t pooled;
    size_t events_created; /* device-copy path, under mu: at most one per handle ever allocated */
    mt_stager_stats stats; /* under mu */
    bool stop;
    pthread_t thread;
    bool thread_started;
    bool thread_ready;       /* the staging thread's setup (binding the device) is done, under mu */
    mt_status thread_status; /* and its outcome, with thread_error */
    char thread_error[256];

    mt_stream *stream; /* device-copy path */
    /* MT_TEST_STAGE_COPY_FAIL=1 at mt_stager_create, or mt_stager_inject_copy_failure: every
     * copy started fails on the staging thread. Read per copy from here, never from environ. */
    atomic_bool inject_copy_fail;
};

/* Tests: makes the copies started from now on fail (on) or not. */
void mt_stager_inject_copy_failure(mt_stager *st, bool on);

#endif
