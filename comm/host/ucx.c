/* The UCX transport: one ucp context and one worker per process, endpoints to every rank created
 * eagerly from the worker addresses published in the store ("mt/ucx/addr/<rank>").
 *
 * Thread mode: UCS_THREAD_MODE_SERIALIZED. The worker and endpoints are created on the calling
 * thread before the progress thread starts (pthread_create orders those accesses); from then on
 * only the progress thread calls into the worker. The one exception is ucp_worker_signal, which
 * UCX documents as safe from any thread in every mode; user threads call it after queueing work.
 * SERIALIZED rather than MULTI so that UCX takes no locks on the hot path.
 *
 * UCX_* variables are honoured as UCX reads them (ucp_config_read with no overrides).
 */
#include "comm/coll_scratch.h"
#include "comm/group.h"
#include "comm/host/shm.h"
#include "comm/host/ucx.h"
#include "comm/progress.h"
#include "comm/schedule.h"
#include "comm/work.h"

#include "core/clock.h"
#include "core/env.h"
#include "core/error.h"

#include <meshtrain/log.h>
#include <meshtrain/store.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Upper bounds of the tuning knobs: far above any useful value, low enough that nothing derived
 * from them (scratch sizes, an int window) overflows. */
#define MAX_CHUNK_BYTES ((size_t)1 << 30)
#define MAX_WINDOW 4096
#define MAX_SMALL_BYTES ((size_t)1 << 30)

typedef struct ep_arg {
    mt_transport *tr;
    int rank;
} ep_arg;

void mt_describe_rank(mt_transport *tr, int global_rank, char *out, size_t cap) {
    const char *host = tr && tr->rt ? mt_runtime_host_of(tr->rt, global_rank) : NULL;
    snprintf(out, cap, "rank %d (host %s)", global_rank, host ? host : "?");
}

/* The operation's code in the tag: a send and a receive are the same point-to-point exchange. */
static uint64_t tag_op_of(mt_op_kind kind) {
    switch (kind) {
    case MT_OP_ALL_GATHER: return 0;
    case MT_OP_REDUCE_SCATTER: return 1;
    case MT_OP_ALL_REDUCE: return 2;
    case MT_OP_BROADCAST: return 3;
    case MT_OP_BARRIER: return 4;
    case MT_OP_SEND:
    case MT_OP_RECV: return 5;
    }
    return MT_TAG_OP_MASK;
}

uint64_t mt_tag_make(const mt_work *w, int src, uint32_t sub) {
    return ((uint64_t)(w->group->id & 0xffffu) << MT_TAG_GROUP_SHIFT) |
           (tag_op_of(w->kind) << MT_TAG_OP_SHIFT) |
           ((uint64_t)(w->seq & MT_TAG_SEQ_MASK) << MT_TAG_SEQ_SHIFT) |
           ((uint64_t)((uint32_t)src & MT_TAG_SRC_MASK) << MT_TAG_SRC_SHIFT) |
           (uint64_t)(sub & MT_TAG_SUB_MASK);
}

static void ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status) {
    ep_arg *a = arg;
    char who[160];
    mt_describe_rank(a->tr, a->rank, who, sizeof who);
    mt_log(MT_LOG_WARN, "UCX endpoint to %s failed: %s", who, ucs_status_string(status));
    if (a->tr->ep_status[a->rank] == UCS_OK) a->tr->ep_status[a->rank] = status;
}

void mt_task_done(mt_task *task, ucs_status_t status) {
    mt_work *w = task->work;
    task->state = MT_TASK_DONE;
    task->req = NULL;
    task->ucs = status;
    if (task->kind == MT_TASK_SEND)
        w->inflight_send--;
    else
        w->inflight_recv--;
    /* Once a work is failing its group may already be gone: touch nothing but the counters. */
    if (status != UCS_OK && !w->failing) {
        char who[160];
        mt_describe_rank(w->tr, mt_group_global_rank(w->group, task->peer), who, sizeof who);
        mt_work_fail(w, status == UCS_ERR_CANCELED ? MT_ERR_COMM : MT_ERR_PEER_LOST,
                     "%s %s %s failed: %s", task->kind == MT_TASK_SEND ? "sending to" : "receiving from",
                     who, "over UCX", ucs_status_string(status));
    }
}

static void send_cb(void *request, ucs_status_t status, void *user_data) {
    mt_task_done(user_data, status);
    ucp_request_free(request);
}

/* A shared-memory descriptor still has to be read (comm/host/shm.c); data must have the size the
 * schedule expects. */
static void recv_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                    void *user_data) {
    mt_task *task = user_data;
    task->req = NULL;
    if (status == UCS_OK && (info->sender_tag & MT_TAG_DESC_BIT))
        status = mt_shm_receive(task->work->tr, task, info->length);
    else if (status == UCS_OK && info->length != task->bytes)
        status = UCS_ERR_MESSAGE_TRUNCATED;
    mt_task_done(task, status);
    ucp_request_free(request);
}

mt_status mt_transport_post(mt_transport *tr, mt_task *task) {
    mt_work *w = task->work;
    mt_group *g = w->group;
    int peer_global = g->ranks[task->peer];
    ucp_request_param_t param;
    memset(&param, 0, sizeof param);
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_contig(1);
    param.user_data = task;
    void *req;
    if (tr->ep_status[peer_global] != UCS_OK) {
        char who[160];
        mt_describe_rank(tr, peer_global, who, sizeof who);
        mt_work_fail(w, MT_ERR_PEER_LOST, "the connection to %s failed: %s", who,
                     ucs_status_string(tr->ep_status[peer_global]));
        return MT_ERR_PEER_LOST;
    }
    task->state = MT_TASK_POSTED;
    if (task->kind == MT_TASK_SEND) {
        uint64_t tag = mt_tag_make(w, g->rank, task->sub);
        w->inflight_send++;
        if (mt_shm_try_send(tr, task, tag, peer_global)) return w->failing ? w->status : MT_OK;
        param.cb.send = send_cb;
        req = ucp_tag_send_nbx(tr->eps[peer_global], task->src, task->bytes, tag, &param);
    } else {
        uint64_t tag = mt_tag_make(w, task->peer, task->sub);
        /* Always through the callback, which sees the sender's tag and the length (UCX 1.13
         * leaves recv_info unfilled when a receive completes at once). */
        param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        param.cb.recv = recv_cb;
        w->inflight_recv++;
        req = ucp_tag_recv_nbx(tr->worker, task->dst, task->bytes, tag, mt_shm_recv_mask(task),
                               &param);
    }
    if (req == NULL) {
        mt_task_done(task, UCS_OK);
    } else if (UCS_PTR_IS_ERR(req)) {
        mt_task_done(task, UCS_PTR_STATUS(req));
        return w->status;
    } else {
        task->req = req;
    }
    return MT_OK;
}

void mt_transport_cancel(mt_transport *tr, mt_task *task) {
    /* A finished receive whose reduction never ran still owes its sender the ack. */
    if (task->kind == MT_TASK_RECV && task->shm.src) mt_shm_release(tr, task);
    if (task->state != MT_TASK_POSTED) return;
    if (task->req) ucp_request_cancel(tr->worker, task->req);
    if (task->shm.ack_req) ucp_request_cancel(tr->worker, task->shm.ack_req);
}

static mt_status ucs_fail(ucs_status_t s, const char *what) {
    return mt_error(MT_ERR_COMM, "UCX %s failed: %s", what, ucs_status_string(s));
}

static mt_status open_worker(mt_transport *tr) {
    ucp_config_t *config;
    ucs_status_t s = ucp_config_read(NULL, NULL, &config);
    if (s != UCS_OK) return ucs_fail(s, "reading its configuration (UCX_* variables)");
    ucp_params_t params;
    memset(&params, 0, sizeof params);
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 0;
    s = ucp_init(&params, config, &tr->ctx);
    ucp_config_release(config);
    if (s != UCS_OK) return ucs_fail(s, "context creation (ucp_init)");

    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    s = ucp_worker_create(tr->ctx, &wp, &tr->worker);
    if (s != UCS_OK) return ucs_fail(s, "worker creation");
    s = ucp_worker_get_efd(tr->worker, &tr->efd);
    if (s != UCS_OK) return ucs_fail(s, "worker event fd (ucp_worker_get_efd)");
    return MT_OK;
}

/* UCP_ERR_HANDLING_MODE_PEER makes a dead peer fail our requests instead of hanging them, but in
 * UCX 1.13 it also rules out the fastest shared-memory paths (ucx_perftest -e: about a third of
 * the bandwidth between two local processes). Default (MT_UCX_ERR_MODE=auto): PEER towards other
 * hosts, where a dead process shows up as a broken connection, NONE inside a host, where the
 * operation timeout names the peer that stopped answering (and mtrun stops the job when a rank
 * dies). MT_UCX_ERR_MODE=peer|none forces one mode for every peer. */
static ucp_err_handling_mode_t peer_error_mode(mt_transport *tr, int peer) {
    const char *mode = getenv("MT_UCX_ERR_MODE");
    if (mode && !strcmp(mode, "peer")) return UCP_ERR_HANDLING_MODE_PEER;
    if (mode && !strcmp(mode, "none")) return UCP_ERR_HANDLING_MODE_NONE;
    if (mode && *mode && strcmp(mode, "auto") != 0)
        mt_log(MT_LOG_WARN, "MT_UCX_ERR_MODE=%s is not one of auto|peer|none; using auto", mode);
    const char *mine = mt_runtime_host_of(tr->rt, tr->rank);
    const char *theirs = mt_runtime_host_of(tr->rt, peer);
    bool same_host = mine && theirs && strcmp(mine, theirs) == 0;
    return same_host ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
}

static mt_status exchange_and_connect(mt_transport *tr) {
    mt_store *store = mt_runtime_store(tr->rt);
    double timeout = mt_runtime_timeout(tr->rt);
    ucp_address_t *addr;
    size_t addr_len;
    ucs_status_t s = ucp_worker_get_address(tr->worker, &addr, &addr_len);
    if (s != UCS_OK) return ucs_fail(s, "getting the worker address");
    char key[64];
    snprintf(key, sizeof key, "mt/ucx/addr/%d", tr->rank);
    mt_status st = mt_store_set(store, key, addr, addr_len);
    ucp_worker_release_address(tr->worker, addr);
    if (st != MT_OK) return mt_error_wrap(st, "publishing the UCX worker address");

    tr->eps = calloc((size_t)tr->world, sizeof *tr->eps);
    tr->ep_status = calloc((size_t)tr->world, sizeof *tr->ep_status);
    ep_arg *ep_args = calloc((size_t)tr->world, sizeof *ep_args);
    tr->ep_args = ep_args;
    if (!tr->eps || !tr->ep_status || !ep_args)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "allocating %d UCX endpoints", tr->world);
    /* Start with the next rank so that not everyone asks the store for rank 0's key first. */
    for (int i = 0; i < tr->world; i++) {
        int r = (tr->rank + i) % tr->world;
        void *peer_addr;
        size_t peer_len;
        snprintf(key, sizeof key, "mt/ucx/addr/%d", r);
        char who[160];
        mt_describe_rank(tr, r, who, sizeof who);
        st = mt_store_get(store, key, timeout, &peer_addr, &peer_len);
        if (st != MT_OK)
            return mt_error_wrap(st, "waiting for the UCX address of %s", who);
        ep_args[r].tr = tr;
        ep_args[r].rank = r;
        ucp_ep_params_t ep;
        memset(&ep, 0, sizeof ep);
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.address = peer_addr;
        ep.err_mode = peer_error_mode(tr, r);
        ep.err_handler.cb = ep_error_cb;
        ep.err_handler.arg = &ep_args[r];
        s = ucp_ep_create(tr->worker, &ep, &tr->eps[r]);
        free(peer_addr);
        if (s != UCS_OK)
            return mt_error(MT_ERR_COMM, "UCX endpoint to %s could not be created: %s", who,
                            ucs_status_string(s));
    }
    return MT_OK;
}

mt_status mt_transport_create(mt_runtime *rt, mt_transport **out) {
    *out = NULL;
    mt_transport *tr = calloc(1, sizeof *tr);
    if (!tr) return mt_error(MT_ERR_OUT_OF_MEMORY, "allocating the UCX transport");
    tr->rt = rt;
    tr->rank = mt_runtime_rank(rt);
    tr->world = mt_runtime_world_size(rt);
    tr->efd = -1;
    /* Tuning knobs (bytes): pipeline chunk, chunks in flight per direction, small-message
     * threshold below which latency-friendly algorithms are used. */
    long long window = 8, local_direct_rs = 1;
    mt_status st = mt_env_bytes("MT_COMM_CHUNK_BYTES", 1, MAX_CHUNK_BYTES, 4u << 20,
                                "the ring pipeline's chunk", &tr->chunk_bytes);
    if (st == MT_OK)
        st = mt_env_int("MT_COMM_WINDOW", 1, MAX_WINDOW, 8, "chunks in flight per direction",
                        &window);
    if (st == MT_OK)
        st = mt_env_bytes("MT_COMM_SMALL_BYTES", 1, MAX_SMALL_BYTES, MT_COMM_SMALL_BYTES_DEFAULT,
                          "messages below it use latency-friendly algorithms", &tr->small_bytes);
    if (st == MT_OK)
        st = mt_env_int("MT_COMM_LOCAL_DIRECT_RS", 0, 1, 1,
                        "1: one-pass reduce-scatter among ranks of one host, 0: the ring",
                        &local_direct_rs);
    if (st != MT_OK) {
        free(tr);
        return mt_error_wrap(st, "cannot create the host transport");
    }
    tr->window = (int)window;
    tr->local_direct_rs = local_direct_rs == 1;
    pthread_mutex_init(&tr->mu, NULL);
    /* Waits on it have monotonic deadlines (host_backend.c, group.c). */
    if (mt_cond_init_monotonic(&tr->done_cv) != 0) {
        pthread_mutex_destroy(&tr->mu);
        free(tr);
        return mt_error(MT_ERR_SYSTEM, "cannot create the host transport's condition variable");
    }

    st = open_worker(tr);
    if (st == MT_OK) st = exchange_and_connect(tr);
    if (st == MT_OK) st = mt_shm_init(tr);
    if (st == MT_OK) st = mt_progress_start(tr);
    if (st != MT_OK) {
        mt_transport_destroy(tr);
        return st;
    }
    *out = tr;
    return MT_OK;
}

/* Closes every endpoint, flushing with a bounded wait (the progress thread is stopped). */
static void close_endpoints(mt_transport *tr) {
    if (!tr->eps) return;
    void **reqs = calloc((size_t)tr->world, sizeof *reqs);
    for (int r = 0; r < tr->world; r++) {
        if (!tr->eps[r]) continue;
        ucp_request_param_t p;
        memset(&p, 0, sizeof p);
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        /* A failed endpoint cannot flush; close it forcibly. */
        p.flags = tr->ep_status[r] == UCS_OK ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
        void *req = ucp_ep_close_nbx(tr->eps[r], &p);
        if (UCS_PTR_IS_PTR(req) && reqs) reqs[r] = req;
        else if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
        tr->eps[r] = NULL;
    }
    double limit = 5.0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        bool pending = false;
        for (int r = 0; reqs && r < tr->world; r++) {
            if (!reqs[r]) continue;
            if (ucp_request_check_status(reqs[r]) == UCS_INPROGRESS) pending = true;
            else {
                ucp_request_free(reqs[r]);
                reqs[r] = NULL;
            }
        }
        if (!pending) break;
        ucp_worker_progress(tr->worker);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 > limit) {
            mt_log(MT_LOG_WARN, "closing UCX endpoints took more than %.0f s; giving up on the "
                                "flush", limit);
            for (int r = 0; r < tr->world; r++)
                if (reqs[r]) ucp_request_cancel(tr->worker, reqs[r]);
            break;
        }
        usleep(100);
    }
    free(reqs);
}

void mt_transport_destroy(mt_transport *tr) {
    if (!tr) return;
    mt_progress_stop(tr);
    if (tr->world_group) {
        mt_group_free(tr->world_group);
        tr->world_group = NULL;
    }
    if (tr->worker) close_endpoints(tr);
    if (tr->worker) ucp_worker_destroy(tr->worker);
    mt_progress_free_zombies(tr);
    mt_shm_close(tr);
    if (tr->ctx) ucp_cleanup(tr->ctx);
    while (tr->memberships) {
        mt_membership_count *m = tr->memberships;
        tr->memberships = m->next;
        free(m);
    }
    free(tr->eps);
    free(tr->ep_status);
    free(tr->ep_args);
    pthread_mutex_destroy(&tr->mu);
    pthread_cond_destroy(&tr->done_cv);
    free(tr);
}

mt_status mt_transport_world_group(mt_runtime *rt, mt_transport *tr, mt_group **out) {
    *out = NULL;
    if (!tr->world_group) {
        int *ranks = malloc((size_t)tr->world * sizeof *ranks);
        if (!ranks) return mt_error(MT_ERR_OUT_OF_MEMORY, "allocating the world group");
        for (int i = 0; i < tr->world; i++) ranks[i] = i;
        tr->world_group = mt_group_alloc(tr, ranks, tr->world, "world");
        free(ranks);
        if (!tr->world_group) return mt_error(MT_ERR_OUT_OF_MEMORY, "allocating the world group");
        mt_group_set_id(tr->world_group, 0);
        tr->world_group->is_world = true;
    }
    *out = tr->world_group;
    return MT_OK;
}
