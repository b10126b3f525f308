/* The NCCL backend (comm/backend.h): collectives on a mesh dimension's NCCL communicator
 * (comm/nccl/nccl_comm.h), queued on the communicator's stream behind the compute queued so far,
 * and waited for with NCCL's asynchronous errors and MT_TIMEOUT_S in view. NCCL builds only; the
 * file is empty otherwise. */
#ifdef MT_HAVE_NCCL
#include "comm/abort_probe.h"
#include "comm/backend.h"
#include "comm/group.h"
#include "comm/nccl/nccl_internal.h"
#include "comm/work.h"

#include "core/clock.h"
#include "core/cuda/cuda_internal.h"
#include "core/error.h"

#include <meshtrain/log.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static ncclRedOp_t nccl_redop(mt_reduce_op op) {
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
    ncclRedOp_t rop = split_avg(w) ? ncclSum : nccl_redop(w->rop);
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

static mt_status nccl_submit(mt_work *w) {
    mt_group *g = w->group;
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
    w->backend_data = op;
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
    struct mt_nccl_op *op = w->backend_data;
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

static mt_status nccl_wait(mt_work *w, double timeout_s) {
    struct mt_nccl_op *op = w->backend_data;
    if (timeout_s < 0) timeout_s = mt_runtime_timeout(op->comm->rt);
    double deadline = mt_clock_now_s() + timeout_s;
    mt_status st = MT_OK;
    char why[1024], msg[MT_NCCL_MSG_CAP];
    for (long polls = 0;; polls++) {
        if (poll_once(w, &st) != 0) return st;
        if (mt_clock_now_s() > deadline) break;
        /* A rank that aborted the job will never join: stop waiting for it. */
        mt_status cause;
        if (polls > 2000 && mt_comm_job_aborted(&cause, why, sizeof why)) {
            snprintf(msg, sizeof msg, "%s: stopped because the job was aborted: %s; the "
                     "communicator was aborted", op->what, why);
            return finish(op, mt_nccl_break(op->comm, cause, msg), msg);
        }
        /* Spin briefly (a collective often ends within microseconds of the wait), then sleep in
         * short steps so that a long wait does not burn a core. */
        if (polls > 2000) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
    snprintf(msg, sizeof msg, "%s: not complete after %g s (MT_TIMEOUT_S): a member did not "
             "join it or is stuck; the communicator was aborted", op->what, timeout_s);
    mt_status broken = mt_nccl_break(op->comm, MT_ERR_TIMEOUT, msg);
    return finish(op, broken, msg);
}

static mt_status nccl_test(mt_work *w, bool *done) {
    mt_status st = MT_OK;
    *done = poll_once(w, &st) != 0;
    return st;
}

static void nccl_release(mt_work *w) {
    struct mt_nccl_op *op = w->backend_data;
    if (!op) return;
    if (!op->finished && mt_work_wait(w, -1) != MT_OK)
        mt_log(MT_LOG_WARN, "freeing unfinished NCCL work: %s", mt_last_error());
    cudaEventDestroy(op->done);
    mt_nccl_comm *c = op->comm;
    free(op);
    w->backend_data = NULL;
    /* The mesh was destroyed before this work was freed: the last one frees the communicator. */
    if (--c->live_ops == 0 && c->orphaned) free(c);
}

/* The wait that timed out aborted the communicator, which ends the operation: nothing is left to
 * abandon. */
static void nccl_cancel(mt_work *w) { (void)w; }

const mt_comm_backend mt_nccl_backend = {
    .name = "nccl",
    .submit = nccl_submit,
    .test = nccl_test,
    .wait = nccl_wait,
    .cancel = nccl_cancel,
    .release = nccl_release,
};

#endif
