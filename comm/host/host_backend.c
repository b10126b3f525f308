/* The host backend (comm/backend.h): work queued for the progress thread (comm/progress.c),
 * which runs its schedule over UCX and shared memory; waiters sleep on the transport's done_cv
 * until the thread publishes the result under tr->mu. */
#include "comm/abort_probe.h"
#include "comm/backend.h"
#include "comm/group.h"
#include "comm/host/ucx.h"

#include "core/clock.h"
#include "core/error.h"

#include <meshtrain/log.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <time.h>

/* Queues the work for the progress thread, which takes a reference until it is done with it. */
static mt_status host_submit(mt_work *w) {
    mt_transport *tr = w->tr;
    pthread_mutex_lock(&tr->mu);
    if (tr->stop) {
        pthread_mutex_unlock(&tr->mu);
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': the transport is shutting down",
                        mt_op_name(w->kind), w->group->name);
    }
    if (atomic_load(&tr->broken)) {
        pthread_mutex_unlock(&tr->mu);
        return mt_error(MT_ERR_COMM, "%s on group '%s': the host transport is unusable: %s",
                        mt_op_name(w->kind), w->group->name, tr->broken_msg);
    }
    mt_group *g = w->group;
    g->pending++;
    if (w->kind == MT_OP_SEND) w->seq = g->p2p_send_seq[w->root]++;
    else if (w->kind == MT_OP_RECV) w->seq = g->p2p_recv_seq[w->root]++;
    else w->seq = g->next_seq++;
    atomic_fetch_add(&w->refs, 1);
    w->next = NULL;
    if (tr->queue_tail) tr->queue_tail->next = w;
    else tr->queue_head = w;
    tr->queue_tail = w;
    pthread_mutex_unlock(&tr->mu);
    ucp_worker_signal(tr->worker);
    return MT_OK;
}

static mt_status finished_status(mt_work *w) {
    if (w->status == MT_OK) return MT_OK;
    return mt_error(w->status, "%s", w->errmsg);
}

static void fail_group_locked(mt_group *g, const char *msg) {
    if (!atomic_load(&g->failed)) {
        snprintf(g->fail_msg, sizeof g->fail_msg, "%s", msg);
        atomic_store(&g->failed, true);
    }
}

/* Another rank aborted the job (comm/abort_probe.h): the peers this work waits for may never
 * come, so it is abandoned like a timed-out one, with the aborting rank's status and message. */
static mt_status abandon_after_abort(mt_work *w, mt_status cause, const char *why) {
    mt_transport *tr = w->tr;
    char prefix[160], msg[MT_ERRMSG_CAP];
    mt_work_describe(w, prefix, sizeof prefix);
    snprintf(msg, sizeof msg, "%s: stopped because the job was aborted: %s", prefix, why);
    pthread_mutex_lock(&tr->mu);
    bool done = w->done;
    if (!done) fail_group_locked(w->group, msg);
    mt_status st = done ? finished_status(w) : cause;
    pthread_mutex_unlock(&tr->mu);
    if (done) return st;
    atomic_store(&w->abort_requested, true);
    ucp_worker_signal(tr->worker);
    mt_failure_note_comm(cause, msg);
    return mt_error(cause, "%s", msg);
}

/* On a timeout, names what the work waited for and makes the group unusable: its members are
 * out of step from here on. While it waits it looks, every MT_ABORT_PROBE_INTERVAL_S, whether
 * another rank aborted the job. */
static mt_status host_wait(mt_work *w, double timeout_s) {
    mt_transport *tr = w->tr;
    if (timeout_s < 0) timeout_s = mt_runtime_timeout(tr->rt);
    double end_s = mt_clock_now_s() + timeout_s;
    char why[1024];
    pthread_mutex_lock(&tr->mu);
    while (!w->done) {
        double left = end_s - mt_clock_now_s();
        if (left <= 0) break;
        struct timespec step =
            mt_clock_deadline(left < MT_ABORT_PROBE_INTERVAL_S ? left : MT_ABORT_PROBE_INTERVAL_S);
        int rc = pthread_cond_timedwait(&tr->done_cv, &tr->mu, &step);
        if (rc != ETIMEDOUT || w->done) continue;
        pthread_mutex_unlock(&tr->mu);
        mt_status cause;
        if (mt_comm_job_aborted(&cause, why, sizeof why)) return abandon_after_abort(w, cause, why);
        pthread_mutex_lock(&tr->mu);
    }
    if (w->done) {
        mt_status st = finished_status(w);
        pthread_mutex_unlock(&tr->mu);
        return st;
    }
    mt_group *g = w->group;
    char prefix[160], msg[MT_ERRMSG_CAP], who[200];
    mt_work_describe(w, prefix, sizeof prefix);
    int peer = atomic_load(&w->waiting_peer);
    if (!w->started && g->running != NULL)
        snprintf(who, sizeof who, "an earlier operation on the group to finish");
    else if (peer >= 0)
        mt_describe_rank(tr, g->ranks[peer], who, sizeof who);
    else
        snprintf(who, sizeof who, "the operation to start");
    snprintf(msg, sizeof msg, "%s: timed out after %g s waiting for %s", prefix, timeout_s, who);
    fail_group_locked(g, msg);
    pthread_mutex_unlock(&tr->mu);
    /* The cause, recorded before the abandoned work's own failure ("abandoned after its waiter
     * timed out"): what mt_finalize tells the other ranks. */
    mt_failure_note_comm(MT_ERR_TIMEOUT, msg);
    return mt_error(MT_ERR_TIMEOUT, "%s", msg);
}

static mt_status host_test(mt_work *w, bool *done) {
    mt_transport *tr = w->tr;
    pthread_mutex_lock(&tr->mu);
    mt_status st = MT_OK;
    if (w->done) {
        *done = true;
        st = finished_status(w);
    }
    pthread_mutex_unlock(&tr->mu);
    return st;
}

/* The progress thread fails the work (MT_ERR_TIMEOUT), cancels its requests and publishes it
 * once its receives are cancelled (comm/progress.c, advance_active). */
static void host_cancel(mt_work *w) {
    atomic_store(&w->abort_requested, true);
    ucp_worker_signal(w->tr->worker);
}

static void host_release(mt_work *w) {
    mt_transport *tr = w->tr;
    pthread_mutex_lock(&tr->mu);
    bool done = w->done;
    pthread_mutex_unlock(&tr->mu);
    if (!done && !atomic_load(&w->abort_requested)) {
        /* Still running: wait (bounded) so that buffers are not released under UCX. */
        mt_status st = mt_work_wait(w, -1);
        if (st != MT_OK) mt_log(MT_LOG_WARN, "freeing unfinished work: %s", mt_last_error());
    }
    if (!done) {
        /* An abandoned work completes as soon as the progress thread cancelled its receives.
         * If that has not happened within MT_TIMEOUT_S, UCX may still hold receives posted into
         * the work's buffers: handing them back would turn a hang into silent corruption. The
         * transport is marked broken (every later operation fails) and the work, with its
         * reference on the buffers' memory, stays with the progress thread; the caller is told
         * not to free or reuse the buffers (they are leaked on purpose). */
        double timeout = mt_runtime_timeout(tr->rt);
        double end_s = mt_clock_now_s() + timeout;
        pthread_mutex_lock(&tr->mu);
        while (!w->done && mt_clock_now_s() < end_s) {
            struct timespec until = mt_clock_deadline(end_s - mt_clock_now_s());
            pthread_cond_timedwait(&tr->done_cv, &tr->mu, &until);
        }
        bool finished = w->done;
        if (!finished && !atomic_load(&tr->broken)) {
            char what[160];
            mt_work_describe(w, what, sizeof what);
            snprintf(tr->broken_msg, sizeof tr->broken_msg,
                     "%s was not cancelled within %g s (MT_TIMEOUT_S)", what, timeout);
            atomic_store(&tr->broken, true);
        }
        pthread_mutex_unlock(&tr->mu);
        if (!finished) {
            char what[160];
            mt_work_describe(w, what, sizeof what);
            mt_log(MT_LOG_ERROR, "%s: the progress thread did not finish cancelling it within "
                   "%g s (MT_TIMEOUT_S); UCX may still write into its buffers, which must NOT be "
                   "freed or reused (they are leaked on purpose); the host transport is now "
                   "unusable and every later operation on it fails", what, timeout);
        }
    }
}

const mt_comm_backend mt_host_backend = {
    .name = "host",
    .submit = host_submit,
    .test = host_test,
    .wait = host_wait,
    .cancel = host_cancel,
    .release = host_release,
};
