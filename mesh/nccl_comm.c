/* NCCL communicators per mesh-dimension group (mesh/nccl_comm.h). Group rank 0 makes the unique
 * id and publishes it in the store under mt/nccl/<n>/<first member>, where n counts the
 * communicators this rank created: every member creates one per dimension per mesh, in the same
 * order, so the members agree on n. Communicators are non-blocking and their initialisation is
 * polled with a deadline, so that a member that never arrives is an error, not a hang. */
#include "mesh/nccl_comm.h"

#include "core/device_internal.h"
#include "core/error.h"

#include <meshtrain/log.h>
#include <meshtrain/store.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef MT_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

struct mt_nccl_comm {
    mt_device *dev;
    ncclComm_t comm;
    cudaStream_t stream;
    size_t charged;
    char name[64];
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static mt_status exchange_id(mt_runtime *rt, mt_group *group, ncclUniqueId *id) {
    mt_store *store = mt_runtime_store(rt);
    char counter[64], key[96];
    snprintf(counter, sizeof counter, "mt/nccl/count/%d", mt_runtime_rank(rt));
    int64_t n = 0;
    MT_TRY(mt_store_add(store, counter, 1, &n));
    snprintf(key, sizeof key, "mt/nccl/%lld/%d", (long long)n, mt_group_global_rank(group, 0));
    if (mt_group_rank(group) == 0) {
        ncclResult_t r = ncclGetUniqueId(id);
        if (r != ncclSuccess)
            return mt_error(MT_ERR_COMM, "NCCL communicator of group '%s': ncclGetUniqueId: %s",
                            mt_group_name(group), ncclGetErrorString(r));
        return mt_store_set(store, key, id, sizeof *id);
    }
    void *v = NULL;
    size_t len = 0;
    mt_status st = mt_store_get(store, key, mt_runtime_timeout(rt), &v, &len);
    if (st != MT_OK)
        return mt_error_wrap(st, "NCCL communicator of group '%s': waiting for the id from rank "
                             "%d", mt_group_name(group), mt_group_global_rank(group, 0));
    if (len != sizeof *id) {
        free(v);
        return mt_error(MT_ERR_PROTOCOL, "NCCL communicator of group '%s': the id has %zu bytes, "
                        "expected %zu", mt_group_name(group), len, sizeof *id);
    }
    memcpy(id, v, sizeof *id);
    free(v);
    return MT_OK;
}

/* Polls a non-blocking initialisation until it is done, fails, or runs past the timeout. */
static mt_status wait_init(mt_runtime *rt, mt_nccl_comm *c) {
    double deadline = now_s() + mt_runtime_timeout(rt);
    for (;;) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &async);
        if (r != ncclSuccess) async = r;
        if (async == ncclSuccess) return MT_OK;
        if (async != ncclInProgress)
            return mt_error(MT_ERR_COMM, "NCCL communicator of group '%s' failed to initialise: "
                            "%s (%s)", c->name, ncclGetErrorString(async), ncclGetLastError(c->comm));
        if (now_s() > deadline)
            return mt_error(MT_ERR_TIMEOUT, "NCCL communicator of group '%s' did not initialise "
                            "within %.0f s (MT_TIMEOUT_S): a member did not join", c->name,
                            mt_runtime_timeout(rt));
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

mt_status mt_nccl_comm_create(mt_runtime *rt, mt_group *group, mt_nccl_comm **out) {
    *out = NULL;
    mt_device *dev = mt_runtime_device(rt);
    if (!dev || mt_device_get_kind(dev) != MT_DEVICE_CUDA) return MT_OK;
    mt_nccl_comm *c = calloc(1, sizeof *c);
    if (!c) return mt_error(MT_ERR_OUT_OF_MEMORY, "NCCL communicator: out of memory");
    c->dev = dev;
    snprintf(c->name, sizeof c->name, "%s", mt_group_name(group));
    ncclUniqueId id;
    mt_status st = exchange_id(rt, group, &id);
    size_t free_before = 0, free_after = 0, total = 0;
    if (st == MT_OK && (cudaSetDevice(mt_device_index(dev)) != cudaSuccess ||
                        cudaMemGetInfo(&free_before, &total) != cudaSuccess))
        st = mt_error(MT_ERR_COMM, "NCCL communicator of group '%s': cannot query GPU %d",
                      c->name, mt_device_index(dev));
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
            st = wait_init(rt, c);
    }
    if (st == MT_OK && cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess)
        st = mt_error(MT_ERR_COMM, "NCCL communicator of group '%s': cannot create its stream",
                      c->name);
    if (st == MT_OK && cudaMemGetInfo(&free_after, &total) == cudaSuccess &&
        free_after < free_before) {
        c->charged = free_before - free_after;
        mt_device_charge_external(dev, MT_MEM_COMM, c->charged);
    }
    if (st != MT_OK) {
        mt_nccl_comm_destroy(c);
        return st;
    }
    *out = c;
    return MT_OK;
}

void mt_nccl_comm_destroy(mt_nccl_comm *c) {
    if (!c) return;
    if (c->comm) {
        /* Abort rather than destroy: it never waits on peers that may be gone. */
        ncclCommAbort(c->comm);
    }
    if (c->stream) cudaStreamDestroy(c->stream);
    if (c->charged) mt_device_release_external(c->dev, MT_MEM_COMM, c->charged);
    free(c);
}

#else /* no NCCL in this build: GPU ranks could not exist, nothing to create */

mt_status mt_nccl_comm_create(mt_runtime *rt, mt_group *group, mt_nccl_comm **out) {
    (void)rt;
    (void)group;
    *out = NULL;
    return MT_OK;
}

void mt_nccl_comm_destroy(mt_nccl_comm *comm) { (void)comm; }

#endif
