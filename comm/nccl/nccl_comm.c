/* NCCL communicators per mesh-dimension group (comm/nccl/nccl_comm.h). Group rank 0 makes the unique
 * id and publishes it in the store under mt/nccl/<n>/<first member>, where n counts the
 * communicators this rank created: every member creates one per dimension per mesh, in the same
 * order, so the members agree on n. Communicators are non-blocking and their initialisation is
 * polled with a deadline, so that a member that never arrives is an error, not a hang. */
#include "comm/nccl/nccl_comm.h"

#include "core/device_internal.h"
#include "core/error.h"

#include <meshtrain/log.h>
#include <meshtrain/store.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef MT_HAVE_NCCL
#include "comm/group.h"
#include "comm/nccl/nccl_internal.h"
#include "core/clock.h"
#include "core/cuda/cuda_internal.h"

/* The value under the id's key: ID_TAG and the id, or FAIL_TAG and why group rank 0 has none,
 * so that the other members stop with its reason instead of waiting for MT_TIMEOUT_S. */
#define ID_TAG 'I'
#define FAIL_TAG 'E'

/* key (96 bytes) receives the store key of the id, which group rank 0 deletes once every member
 * has joined (a later job on the same store must not find it). */
static mt_status exchange_id(mt_runtime *rt, mt_group *group, ncclUniqueId *id, char *key) {
    mt_store *store = mt_runtime_store(rt);
    char counter[64];
    snprintf(counter, sizeof counter, "mt/nccl/count/%d", mt_runtime_rank(rt));
    int64_t n = 0;
    MT_TRY(mt_store_add(store, counter, 1, &n));
    snprintf(key, 96, "mt/nccl/%lld/%d", (long long)n, mt_group_global_rank(group, 0));
    unsigned char value[1 + sizeof *id];
    if (mt_group_rank(group) == 0) {
        ncclResult_t r = ncclGetUniqueId(id);
        if (r != ncclSuccess) {
            char why[MT_NCCL_MSG_CAP];
            snprintf(why, sizeof why, "%cncclGetUniqueId: %s (%s)", FAIL_TAG,
                     ncclGetErrorString(r), ncclGetLastError(NULL));
            if (mt_store_set(store, key, why, strlen(why)) != MT_OK)
                mt_log(MT_LOG_DEBUG, "could not publish the failure: %s", mt_last_error());
            return mt_error(MT_ERR_COMM, "NCCL communicator of group '%s': %s",
                            mt_group_name(group), why + 1);
        }
        value[0] = ID_TAG;
        memcpy(value + 1, id, sizeof *id);
        return mt_store_set(store, key, value, sizeof value);
    }
    void *v = NULL;
    size_t len = 0;
    mt_status st = mt_store_get(store, key, mt_runtime_timeout(rt), &v, &len);
    if (st != MT_OK)
        return mt_error_wrap(st, "NCCL communicator of group '%s': waiting for the id from rank "
                             "%d", mt_group_name(group), mt_group_global_rank(group, 0));
    const char *tagged = v;
    if (len > 0 && tagged[0] == FAIL_TAG) {
        st = mt_error(MT_ERR_COMM, "NCCL communicator of group '%s': rank %d has no id: %.*s",
                      mt_group_name(group), mt_group_global_rank(group, 0), (int)(len - 1),
                      tagged + 1);
        free(v);
        return st;
    }
    if (len != sizeof value || tagged[0] != ID_TAG) {
        free(v);
        return mt_error(MT_ERR_PROTOCOL, "NCCL communicator of group '%s': the id has %zu bytes, "
                        "expected %zu", mt_group_name(group), len, sizeof value);
    }
    memcpy(id, tagged + 1, sizeof *id);
    free(v);
    return MT_OK;
}

mt_status mt_nccl_wait_ready(mt_nccl_comm *c, const char *what, double timeout_s) {
    double deadline = mt_clock_now_s() + timeout_s;
    for (long polls = 0;; polls++) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &async);
        if (r != ncclSuccess) async = r;
        if (async == ncclSuccess) return MT_OK;
        if (async != ncclInProgress) {
            char msg[MT_NCCL_MSG_CAP];
            snprintf(msg, sizeof msg, "%s on NCCL communicator of group '%s' failed: %s (%s)",
                     what, c->name, ncclGetErrorString(async), ncclGetLastError(c->comm));
            return mt_nccl_break(c, MT_ERR_COMM, msg);
        }
        if (mt_clock_now_s() > deadline) {
            char msg[MT_NCCL_MSG_CAP];
            snprintf(msg, sizeof msg, "%s on NCCL communicator of group '%s' did not finish "
                     "within %.0f s (MT_TIMEOUT_S): a member did not join; the communicator was "
                     "aborted", what, c->name, timeout_s);
            return mt_nccl_break(c, MT_ERR_TIMEOUT, msg);
        }
        if (polls > 1000) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
}

mt_status mt_nccl_break(mt_nccl_comm *c, mt_status status, const char *msg) {
    if (!c->broken) {
        c->broken = true;
        snprintf(c->msg, sizeof c->msg, "%s", msg);
        /* Abort rather than destroy: it never waits on peers that may be gone, and it makes the
         * communicator's kernels return, so the streams behind them drain. */
        if (c->comm) ncclCommAbort(c->comm);
        c->comm = NULL;
        if (c->group) mt_group_mark_failed(c->group, c->msg);
        mt_failure_note_comm(status, c->msg);
        mt_log(MT_LOG_ERROR, "%s", c->msg);
    }
    return mt_error(status, "%s", c->msg);
}

mt_status mt_nccl_comm_create(mt_runtime *rt, mt_group *group, mt_nccl_comm **out) {
    *out = NULL;
    mt_device *dev = mt_runtime_device(rt);
    if (!dev || mt_device_get_kind(dev) != MT_DEVICE_CUDA) return MT_OK;
    mt_nccl_comm *c = calloc(1, sizeof *c);
    if (!c) return mt_error(MT_ERR_OUT_OF_MEMORY, "NCCL communicator: out of memory");
    c->rt = rt;
    c->dev = dev;
    snprintf(c->name, sizeof c->name, "%s", mt_group_name(group));
    ncclUniqueId id;
    char key[96] = "";
    mt_status st = exchange_id(rt, group, &id, key);
    size_t free_before = 0, free_after = 0, total = 0;
    if (st == MT_OK && (cudaSetDevice(mt_device_index(dev)) != cudaSuccess ||
                        cudaMemGetInfo(&free_before, &total) != cudaSuccess)) {
        st = mt_error(MT_ERR_COMM, "NCCL communicator of group '%s': cannot query GPU %d: %s",
                      c->name, mt_device_index(dev), cudaGetErrorString(cudaGetLastError()));
    }
    if (st == MT_OK) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        config.commName = c->name;
        ncclResult_t r = ncclCommInitRankConfig(&c->comm, mt_group_size(group), id,
                                                mt_group_rank(group), &config);
        if (r != ncclSuccess && r != ncclInProgress)
            st = mt_error(MT_ERR_COMM, "NCCL communicator of group '%s' (rank %d of %d): %s",
                          c->name, mt_group_rank(group), mt_group_size(group),
                          ncclGetErrorString(r));
        else
            st = mt_nccl_wait_ready(c, "initialisation", mt_runtime_timeout(rt));
        /* Every member read the id before joining, and the initialisation ends only when all
         * joined. */
        if (st == MT_OK && mt_group_rank(group) == 0 &&
            mt_store_delete(mt_runtime_store(rt), key, NULL) != MT_OK)
            mt_error_clear_message(); /* a stale key is harmless to this job */
    }
    if (st == MT_OK && (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) !=
                            cudaSuccess ||
                        cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming) != cudaSuccess))
        st = mt_error(MT_ERR_COMM, "NCCL communicator of group '%s': cannot create its stream "
                      "and event: %s", c->name, cudaGetErrorString(cudaGetLastError()));
    /* The allocator must see the stream: a buffer freed while a collective still reads it is not
     * handed out again before the stream passed that point. */
    if (st == MT_OK && (st = mt_cuda_device_track_stream(dev, c->stream)) == MT_OK)
        c->stream_tracked = true;
    /* cudaMemGetInfo sees the whole GPU: with ranks sharing it, the others' NCCL buffers made at
     * the same time would be counted too, so the charge is left out then. */
    bool shared = mt_runtime_local_world_size(rt) > mt_device_cuda_count(NULL, 0);
    if (st == MT_OK && !shared && cudaMemGetInfo(&free_after, &total) == cudaSuccess &&
        free_after < free_before) {
        c->charged = free_before - free_after;
        mt_device_charge_external(dev, MT_MEM_COMM, c->charged);
    } else if (st == MT_OK && shared) {
        mt_log(MT_LOG_DEBUG, "NCCL communicator of group '%s': its GPU memory is not charged to "
               "comm (ranks share GPU %d)", c->name, mt_device_index(dev));
    }
    if (st != MT_OK) {
        mt_nccl_comm_destroy(c);
        return st;
    }
    c->group = group;
    group->nccl = c;
    *out = c;
    return MT_OK;
}

/* Everything but the object itself: drains and aborts the communicator, releases its stream,
 * event and charge. */
static void release_resources(mt_nccl_comm *c) {
    if (c->comm) {
        /* Work still queued must not touch freed memory: let the stream drain first, for at
         * most MT_TIMEOUT_S (a peer that never comes is then cut off by the abort). */
        double deadline = mt_clock_now_s() + mt_runtime_timeout(c->rt);
        while (c->stream && cudaStreamQuery(c->stream) == cudaErrorNotReady &&
               mt_clock_now_s() < deadline) {
            (void)cudaGetLastError(); /* "not ready" must not reach the next kernel's check */
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        (void)cudaGetLastError();
        /* Abort rather than destroy: it never waits on peers that may be gone. */
        ncclCommAbort(c->comm);
        c->comm = NULL;
    }
    if (c->stream_tracked) mt_cuda_device_untrack_stream(c->dev, c->stream);
    c->stream_tracked = false;
    if (c->ready) cudaEventDestroy(c->ready);
    c->ready = NULL;
    if (c->stream) cudaStreamDestroy(c->stream);
    c->stream = NULL;
    if (c->charged) mt_device_release_external(c->dev, MT_MEM_COMM, c->charged);
    c->charged = 0;
}

void mt_nccl_comm_destroy(mt_nccl_comm *c) {
    if (!c) return;
    if (c->group) c->group->nccl = NULL;
    c->group = NULL;
    if (c->live_ops > 0) {
        /* Work handles still point at it: abort (their waits then fail), release what the
         * device holds, and leave the object to the last mt_work_free. */
        char msg[MT_NCCL_MSG_CAP];
        snprintf(msg, sizeof msg, "NCCL communicator of group '%s' destroyed with %d operation(s) "
                 "not freed (mt_work_free them before destroying the mesh)", c->name,
                 c->live_ops);
        (void)mt_nccl_break(c, MT_ERR_INVALID_ARG, msg);
        mt_error_clear_message();
        release_resources(c);
        c->orphaned = true;
        return;
    }
    release_resources(c);
    free(c);
}

#else /* no NCCL in this build: no communicators (mt_nccl_route refuses GPU buffers) */

mt_status mt_nccl_comm_create(mt_runtime *rt, mt_group *group, mt_nccl_comm **out) {
    (void)rt;
    (void)group;
    *out = NULL;
    return MT_OK;
}

void mt_nccl_comm_destroy(mt_nccl_comm *comm) { (void)comm; }

#endif
