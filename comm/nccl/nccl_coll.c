/* Collectives on a mesh dimension's NCCL communicator (comm/nccl/nccl_comm.h): which path a
 * collective takes, queueing it on the communicator's stream behind the compute queued so far, and
 * waiting for it with NCCL's asynchronous errors and MT_TIMEOUT_S in view. */
#include "comm/nccl/nccl_comm.h"
#include "comm/transport_internal.h"

#include "core/error.h"

#include <meshtrain/log.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef MT_HAVE_CUDA
#include <cuda_runtime.h>

/* True for memory the GPU addresses directly (cudaMalloc, managed); pinned or plain host memory
 * is host memory for this purpose: the host transport can read it. */
static bool on_gpu(const void *p) {
    if (!p) return false;
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* not CUDA's: clear the sticky-free error and call it host */
        return false;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

mt_status mt_nccl_route(mt_group *g, const char *op, const void *a, const void *b,
                        bool *use_nccl) {
    *use_nccl = false;
    mt_device *dev = mt_runtime_device(g->rt);
    if (!dev || mt_device_get_kind(dev) != MT_DEVICE_CUDA) return MT_OK;
    /* On the rank's GPU: a thread that never selected one would make a context on GPU 0. */
    if (cudaSetDevice(mt_device_index(dev)) != cudaSuccess) {
        cudaError_t e = cudaGetLastError();
        return mt_error(MT_ERR_COMM, "%s on group '%s': cannot select GPU %d: %s", op, g->name,
                        mt_device_index(dev), cudaGetErrorString(e));
    }
    bool ga = on_gpu(a), gb = b == a ? ga : on_gpu(b);
    if (!ga && !gb) return MT_OK;
    if ((a && !ga) || (b && !gb))
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': one buffer is GPU memory and the "
                        "other host memory; both must be on the same side", op, g->name);
    if (!g->nccl)
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': the buffers are GPU memory but the "
                        "group has no NCCL communicator (%s); use a mesh dimension's group for "
                        "GPU buffers, or host buffers", op, g->name,
#ifdef MT_HAVE_NCCL
                        g->is_world ? "the world group carries host memory only"
                                    : "only a mesh's groups have one"
#else
                        "this build has no NCCL"
#endif
        );
    /* One stream per communicator: a send and a receive between two ranks queued one after the
     * other would each wait for the other's peer. Until an API issues them together (an NCCL
     * group), point-to-point stays on host buffers. */
    if (!strcmp(op, "send") || !strcmp(op, "recv"))
        return mt_error(MT_ERR_UNSUPPORTED, "%s on group '%s': point-to-point on GPU buffers is "
                        "not supported yet (a send and a receive on one stream can deadlock); "
                        "copy to host memory", op, g->name);
    *use_nccl = true;
    return MT_OK;
}
#else
mt_status mt_nccl_route(mt_group *g, const char *op, const void *a, const void *b,
                        bool *use_nccl) {
    (void)g, (void)op, (void)a, (void)b;
    *use_nccl = false;
    return MT_OK;
}
#endif

#ifdef MT_HAVE_NCCL
#include "core/cuda/cuda_internal.h"
#include "comm/nccl/nccl_internal.h"

struct mt_nccl_op {
    mt_nccl_comm *comm;
    char what[200]; /* "all_reduce of 8 f32 on group 'tp' (NCCL, 2 ranks)": the group may be gone */
    cudaEvent_t done; /* recorded on the communicator's stream after the operation */
    bool finished;
    mt_status status;
    char msg[MT_NCCL_MSG_CAP];
};

static ncclDataType_t nccl_dtype(mt_dtype dt) {
    return dt == MT_BF16 ? ncclBfloat16 : ncclFloat32;
}

static ncclRedOp_t nccl_op(mt_reduce_op op) {
    switch (op) {
    case MT_REDUCE_AVG: return ncclAvg;
    case MT_REDUCE_MAX: return ncclMax;
    default: return ncclSum;
    }
}

static const char *describe(const mt_work *w, char *buf, size_t cap) {
    snprintf(buf, cap, "%s of %zu %s on group '%s' (NCCL, %d ranks)", mt_op_name(w->kind),
             w->count, mt_dtype_name(w->dtype), w->group->name, w->group->size);
    return buf;
}

/* NCCL's bf16 average multiplies every input by 1/n rounded to bf16 before summing, a bias of up
 * to 0.4 % when n is not a power of two; the host transport sums and divides once. Such averages
 * are a sum followed by a scale in f32 (split_avg). */
static bool split_avg(const mt_work *w) {
    int n = w->group->size;
    return w->rop == MT_REDUCE_AVG && w->dtype == MT_BF16 && (n & (n - 1)) != 0;
}

static ncclResult_t issue(mt_nccl_comm *c, const mt_work *w) {
    ncclComm_t comm = c->comm;
    cudaStream_t s = c->stream;
    ncclDataType_t dt = nccl_dtype(w->dtype);
    ncclRedOp_t rop = split_avg(w) ? ncclSum : nccl_op(w->rop);
    switch (w->kind) {
    case MT_OP_ALL_GATHER: return ncclAllGather(w->send, w->recv, w->count, dt, comm, s);
    case MT_OP_REDUCE_SCATTER:
        return ncclReduceScatter(w->send, w->recv, w->count, dt, rop, comm, s);
    case MT_OP_ALL_REDUCE:
        return ncclAllReduce(w->send, w->recv, w->count, dt, rop, comm, s);
    case MT_OP_BROADCAST: return ncclBroadcast(w->send, w->recv, w->count, dt, w->root, comm, s);
    case MT_OP_SEND: return ncclSend(w->send, w->count, dt, w->root, comm, s);
    case MT_OP_RECV: return ncclRecv(w->recv, w->count, dt, w->root, comm, s);
    default: return ncclInvalidUsage;
    }
}

mt_status mt_nccl_enqueue(mt_group *g, mt_work *w) {
    mt_nccl_comm *c = g->nccl;
    char what[200];
    describe(w, what, sizeof what);
    if (!c) return mt_error(MT_ERR_INTERNAL, "%s: the group has no NCCL communicator", what);
    if (c->broken) return mt_error(MT_ERR_COMM, "%s: %s", what, c->msg);
    if (w->kind == MT_OP_BARRIER)
        return mt_error(MT_ERR_INTERNAL, "%s: a barrier has no buffers for NCCL", what);
    if (cudaSetDevice(mt_device_index(c->dev)) != cudaSuccess) {
        cudaError_t e = cudaGetLastError();
        return mt_error(MT_ERR_COMM, "%s: cannot select GPU %d: %s", what,
                        mt_device_index(c->dev), cudaGetErrorString(e));
    }
    struct mt_nccl_op *op = calloc(1, sizeof *op);
    if (!op) return mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    op->comm = c;
    snprintf(op->what, sizeof op->what, "%s", what);
    cudaError_t ce = cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming);
    /* The operation reads what the compute queued so far writes: the communicator's stream waits
     * for that point of the default stream, and nothing later. */
    if (ce == cudaSuccess) ce = cudaEventRecord(c->ready, 0);
    if (ce == cudaSuccess) ce = cudaStreamWaitEvent(c->stream, c->ready, 0);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        if (op->done) cudaEventDestroy(op->done);
        free(op);
        return mt_error(MT_ERR_COMM, "%s: ordering after the default stream: %s", what,
                        cudaGetErrorString(ce));
    }
    ncclResult_t r = issue(c, w);
    mt_status st = MT_OK;
    if (r == ncclInProgress)
        st = mt_nccl_wait_ready(c, what, mt_runtime_timeout(c->rt));
    else if (r != ncclSuccess) {
        char msg[MT_NCCL_MSG_CAP];
        snprintf(msg, sizeof msg, "%s: %s (%s)", what, ncclGetErrorString(r),
                 ncclGetLastError(c->comm));
        st = mt_nccl_break(c, MT_ERR_COMM, msg);
    }
    /* From here the collective is queued: a failure aborts the communicator, so that it cannot
     * write into buffers the caller frees on the error, nor leave this rank out of step with
     * the members that saw it succeed. */
    char step[64] = "";
    if (st == MT_OK && split_avg(w) &&
        (ce = mt_cuda_scale_on_stream(w->recv, w->dtype, w->count, 1.0f / (float)g->size,
                                      c->stream)) != cudaSuccess)
        snprintf(step, sizeof step, "dividing the sum by %d", g->size);
    if (st == MT_OK && !*step && (ce = cudaEventRecord(op->done, c->stream)) != cudaSuccess)
        snprintf(step, sizeof step, "recording its completion");
    if (*step) {
        (void)cudaGetLastError();
        char msg[MT_NCCL_MSG_CAP];
        snprintf(msg, sizeof msg, "%s: %s: %s; the communicator was aborted", what, step,
                 cudaGetErrorString(ce));
        st = mt_nccl_break(c, MT_ERR_COMM, msg);
    }
    if (st != MT_OK) {
        cudaEventDestroy(op->done);
        free(op);
        return st;
    }
    w->nccl_op = op;
    c->live_ops++;
    return MT_OK;
}

static mt_status finish(struct mt_nccl_op *op, mt_status status, const char *msg) {
    op->finished = true;
    op->status = status;
    if (status != MT_OK) snprintf(op->msg, sizeof op->msg, "%s", msg);
    return status == MT_OK ? MT_OK : mt_error(status, "%s", op->msg);
}

/* One look at the work: 1 done (status in op), 0 still running, -1 failed (returned in *st). */
static int poll_once(mt_work *w, mt_status *st) {
    struct mt_nccl_op *op = w->nccl_op;
    mt_nccl_comm *c = op->comm;
    char msg[MT_NCCL_MSG_CAP];
    if (op->finished) {
        *st = op->status == MT_OK ? MT_OK : mt_error(op->status, "%s", op->msg);
        return 1;
    }
    if (c->broken) {
        snprintf(msg, sizeof msg, "%s: %s", op->what, c->msg);
        *st = finish(op, MT_ERR_COMM, msg);
        return -1;
    }
    cudaError_t q = cudaEventQuery(op->done);
    /* Both "not ready" and a real error are also left as the thread's last error, which the next
     * kernel launch's check would take for its own. */
    if (q != cudaSuccess) (void)cudaGetLastError();
    if (q == cudaSuccess) {
        *st = finish(op, MT_OK, NULL);
        return 1;
    }
    if (q != cudaErrorNotReady) {
        snprintf(msg, sizeof msg, "%s: the GPU reported %s", op->what, cudaGetErrorString(q));
        *st = finish(op, MT_ERR_COMM, msg);
        return -1;
    }
    /* A peer that failed or left shows up here, not in the event: that never completes. */
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(c->comm, &async);
    if (r != ncclSuccess) async = r;
    if (async != ncclSuccess && async != ncclInProgress) {
        snprintf(msg, sizeof msg, "%s failed: %s (%s); the communicator was aborted", op->what,
                 ncclGetErrorString(async), ncclGetLastError(c->comm));
        mt_status broken = mt_nccl_break(c, MT_ERR_COMM, msg);
        *st = finish(op, broken, msg);
        return -1;
    }
    return 0;
}

mt_status mt_nccl_work_wait(mt_work *w, double timeout_s) {
    if (timeout_s < 0) timeout_s = mt_runtime_timeout(w->nccl_op->comm->rt);
    double deadline = mt_nccl_now_s() + timeout_s;
    mt_status st = MT_OK;
    for (long polls = 0;; polls++) {
        if (poll_once(w, &st) != 0) return st;
        if (mt_nccl_now_s() > deadline) break;
        /* Spin briefly (a collective often ends within microseconds of the wait), then sleep in
         * short steps so that a long wait does not burn a core. */
        if (polls > 2000) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
    char msg[MT_NCCL_MSG_CAP];
    snprintf(msg, sizeof msg, "%s: not complete after %g s (MT_TIMEOUT_S): a member did not "
             "join it or is stuck; the communicator was aborted", w->nccl_op->what, timeout_s);
    mt_status broken = mt_nccl_break(w->nccl_op->comm, MT_ERR_TIMEOUT, msg);
    return finish(w->nccl_op, broken, msg);
}

mt_status mt_nccl_work_test(mt_work *w, bool *done) {
    mt_status st = MT_OK;
    *done = poll_once(w, &st) != 0;
    return st;
}

void mt_nccl_work_release(mt_work *w) {
    struct mt_nccl_op *op = w->nccl_op;
    if (!op) return;
    if (!op->finished && mt_nccl_work_wait(w, -1) != MT_OK)
        mt_log(MT_LOG_WARN, "freeing unfinished NCCL work: %s", mt_last_error());
    cudaEventDestroy(op->done);
    mt_nccl_comm *c = op->comm;
    free(op);
    w->nccl_op = NULL;
    /* The mesh was destroyed before this work was freed: the last one frees the communicator. */
    if (--c->live_ops == 0 && c->orphaned) free(c);
}

#else /* no NCCL: mt_nccl_route never picks it, so these are never reached */

mt_status mt_nccl_enqueue(mt_group *g, mt_work *w) {
    (void)w;
    return mt_error(MT_ERR_INTERNAL, "group '%s': this build has no NCCL", g->name);
}

mt_status mt_nccl_work_wait(mt_work *w, double timeout_s) {
    (void)w, (void)timeout_s;
    return mt_error(MT_ERR_INTERNAL, "NCCL work in a build without NCCL");
}

mt_status mt_nccl_work_test(mt_work *w, bool *done) {
    (void)w;
    *done = true;
    return mt_error(MT_ERR_INTERNAL, "NCCL work in a build without NCCL");
}

void mt_nccl_work_release(mt_work *w) { (void)w; }

#endif
