/* The communication progress thread and work handles.
 *
 * User threads queue work under tr->mu and wake the thread with ucp_worker_signal (documented as
 * safe from any thread). The thread moves queued work to its groups, runs each group's
 * collectives one after another (point-to-point work runs as soon as it arrives, so that a send
 * and a recv queued on one group cannot block each other), drives the worker, and when nothing
 * moves it arms the worker and sleeps in poll() on the worker's event fd. The poll timeout only
 * bounds how late a stop or abort request is seen; it is not a polling loop.
 */
#include "comm/nccl/nccl_comm.h"
#include "comm/transport_internal.h"

#include "core/error.h"

#include <meshtrain/log.h>

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *mt_op_name(mt_op_kind kind) {
    switch (kind) {
    case MT_OP_ALL_GATHER: return "all_gather";
    case MT_OP_REDUCE_SCATTER: return "reduce_scatter";
    case MT_OP_ALL_REDUCE: return "all_reduce";
    case MT_OP_BROADCAST: return "broadcast";
    case MT_OP_BARRIER: return "barrier";
    case MT_OP_SEND: return "send";
    case MT_OP_RECV: return "recv";
    }
    return "operation";
}

static void op_prefix(const mt_work *w, char *out, size_t cap) {
    snprintf(out, cap, "%s on group '%s' (%d ranks)", mt_op_name(w->kind), w->group->name,
             w->group->size);
}

void mt_work_fail(mt_work *w, mt_status status, const char *fmt, ...) {
    if (w->failing) return; /* the first failure is the one worth reporting */
    w->failing = true;
    w->status = status;
    char prefix[160], msg[MT_ERRMSG_CAP];
    op_prefix(w, prefix, sizeof prefix);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(w->errmsg, sizeof w->errmsg, "%s: %s", prefix, msg);
}

mt_work *mt_work_new(mt_group *group, mt_op_kind kind) {
    mt_work *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->kind = kind;
    w->group = group;
    w->tr = group->tr;
    w->refs = 2;
    w->root = -1;
    atomic_init(&w->waiting_peer, -1);
    atomic_init(&w->abort_requested, false);
    return w;
}

static void work_release_locked(mt_work *w) {
    if (--w->refs == 0) {
        free(w->tasks);
        free(w);
    }
}

mt_status mt_progress_submit(mt_transport *tr, mt_work *w) {
    pthread_mutex_lock(&tr->mu);
    if (tr->stop) {
        pthread_mutex_unlock(&tr->mu);
        return mt_error(MT_ERR_INVALID_ARG, "%s on group '%s': the transport is shutting down",
                        mt_op_name(w->kind), w->group->name);
    }
    mt_group *g = w->group;
    g->pending++;
    if (w->kind == MT_OP_SEND) w->seq = g->p2p_send_seq[w->root]++;
    else if (w->kind == MT_OP_RECV) w->seq = g->p2p_recv_seq[w->root]++;
    else w->seq = g->next_seq++;
    w->next = NULL;
    if (tr->queue_tail) tr->queue_tail->next = w;
    else tr->queue_head = w;
    tr->queue_tail = w;
    pthread_mutex_unlock(&tr->mu);
    ucp_worker_signal(tr->worker);
    return MT_OK;
}

mt_status mt_work_submit_or_wait(mt_work *w, mt_work **out) {
    if (out) *out = NULL;
    /* Work already queued on an NCCL communicator never goes to the progress thread. */
    mt_status st = w->nccl_op ? MT_OK : mt_progress_submit(w->tr, w);
    if (st != MT_OK) {
        free(w);
        return st;
    }
    if (out) {
        *out = w;
        return MT_OK;
    }
    st = mt_work_wait(w, -1);
    mt_work_free(w);
    return st;
}

/* ---- the progress thread -------------------------------------------------------------------- */

static void group_ready(mt_transport *tr, mt_group *g) {
    if (g->in_ready_list) return;
    g->in_ready_list = true;
    g->next_ready = tr->ready;
    tr->ready = g;
}

static void activate(mt_transport *tr, mt_work *w) {
    w->next_active = tr->active;
    tr->active = w;
    w->started = true;
    if (atomic_load(&w->group->failed)) {
        mt_work_fail(w, MT_ERR_COMM, "the group is unusable after an earlier failure: %s",
                     w->group->fail_msg);
        return;
    }
    mt_status st = mt_schedule_build(w);
    if (st != MT_OK && !w->failing)
        mt_work_fail(w, st, "could not schedule the operation: %s", mt_last_error());
}

/* Moves submitted work to the groups; returns whether there was any. */
static bool take_queue(mt_transport *tr, bool *stop) {
    pthread_mutex_lock(&tr->mu);
    mt_work *w = tr->queue_head;
    tr->queue_head = tr->queue_tail = NULL;
    *stop = tr->stop;
    pthread_mutex_unlock(&tr->mu);
    bool any = w != NULL;
    while (w) {
        mt_work *next = w->next;
        w->next = NULL;
        if (w->kind == MT_OP_SEND || w->kind == MT_OP_RECV) {
            activate(tr, w);
        } else {
            mt_group *g = w->group;
            if (g->fifo_tail) g->fifo_tail->next = w;
            else g->fifo_head = w;
            g->fifo_tail = w;
            group_ready(tr, g);
        }
        w = next;
    }
    return any;
}

static void start_ready_groups(mt_transport *tr) {
    mt_group *g = tr->ready;
    tr->ready = NULL;
    while (g) {
        mt_group *next = g->next_ready;
        g->in_ready_list = false;
        g->next_ready = NULL;
        if (!g->running && g->fifo_head) {
            mt_work *w = g->fifo_head;
            g->fifo_head = w->next;
            if (!g->fifo_head) g->fifo_tail = NULL;
            w->next = NULL;
            g->running = w;
            activate(tr, w);
        }
        g = next;
    }
}

static bool group_has_failed_peer(mt_transport *tr, mt_work *w, int *peer) {
    mt_group *g = w->group;
    for (int i = 0; i < g->size; i++) {
        if (tr->ep_status[g->ranks[i]] != UCS_OK) {
            *peer = i;
            return true;
        }
    }
    return false;
}

static void cancel_all(mt_transport *tr, mt_work *w) {
    if (w->cancelled) return;
    w->cancelled = true;
    for (int i = 0; i < w->ntasks; i++) mt_transport_cancel(tr, &w->tasks[i]);
}

/* Makes the result visible to waiters. The progress thread keeps its reference until UCX has
 * given back every request of the work (see release). */
static void publish(mt_transport *tr, mt_work *w) {
    mt_group *g = w->group;
    if (g->running == w) {
        g->running = NULL;
        if (g->fifo_head) group_ready(tr, g);
    }
    pthread_mutex_lock(&tr->mu);
    if (w->failing) {
        if (w->status == MT_OK) w->status = MT_ERR_INTERNAL;
        if (!atomic_load(&g->failed)) {
            snprintf(g->fail_msg, sizeof g->fail_msg, "%s", w->errmsg);
            atomic_store(&g->failed, true);
        }
    }
    w->done = true;
    g->pending--;
    pthread_cond_broadcast(&tr->done_cv);
    pthread_mutex_unlock(&tr->mu);
}

static void release(mt_transport *tr, mt_work *w) {
    pthread_mutex_lock(&tr->mu);
    work_release_locked(w);
    pthread_mutex_unlock(&tr->mu);
}

/* Advances every running work; returns whether anything changed. */
static bool advance_active(mt_transport *tr) {
    bool changed = false;
    mt_work **link = &tr->active;
    while (*link) {
        mt_work *w = *link;
        if (!w->failing && atomic_load(&w->abort_requested))
            mt_work_fail(w, MT_ERR_TIMEOUT, "abandoned after its waiter timed out");
        int peer;
        if (!w->failing && group_has_failed_peer(tr, w, &peer)) {
            char who[160];
            mt_describe_rank(tr, w->group->ranks[peer], who, sizeof who);
            mt_work_fail(w, MT_ERR_PEER_LOST, "the connection to %s failed: %s", who,
                         ucs_status_string(tr->ep_status[w->group->ranks[peer]]));
        }
        if (!w->failing && mt_schedule_advance(w)) changed = true;
        bool published = w->done_published, finished;
        if (w->failing) {
            /* Receives write into user memory: the waiter learns of the failure only once they
             * are cancelled. Sends to a peer that stopped answering may never come back (UCX
             * cannot always cancel them); the work stays on the active list until
             * they do or the endpoints are closed. */
            cancel_all(tr, w);
            if (!published && w->inflight_recv == 0) {
                w->done_published = true;
                publish(tr, w);
                changed = true;
            }
            finished = w->done_published && w->inflight_send == 0;
        } else {
            finished = w->first_undone >= w->ntasks;
            if (finished) {
                w->done_published = true;
                publish(tr, w);
            }
        }
        if (finished) {
            *link = w->next_active;
            release(tr, w);
            changed = true;
        } else {
            link = &w->next_active;
        }
    }
    return changed;
}

static bool only_zombies(mt_transport *tr) {
    for (mt_work *w = tr->active; w; w = w->next_active)
        if (!w->done_published) return false;
    return true;
}

void mt_progress_free_zombies(mt_transport *tr) {
    while (tr->zombies) {
        mt_work *w = tr->zombies;
        tr->zombies = w->next_active;
        release(tr, w);
    }
}

static void *progress_main(void *arg) {
    mt_transport *tr = arg;
    for (;;) {
        bool stop;
        bool changed = take_queue(tr, &stop);
        if (tr->ready) start_ready_groups(tr);
        if (tr->active && advance_active(tr)) changed = true;
        while (ucp_worker_progress(tr->worker)) changed = true;
        if (tr->ready) continue;
        if (stop && only_zombies(tr)) break;
        if (changed) continue;
        ucs_status_t s = ucp_worker_arm(tr->worker);
        if (s == UCS_ERR_BUSY) continue;
        if (s != UCS_OK) {
            mt_log(MT_LOG_ERROR, "ucp_worker_arm failed: %s", ucs_status_string(s));
            break;
        }
        struct pollfd pfd = {.fd = tr->efd, .events = POLLIN};
        int rc = poll(&pfd, 1, 200);
        if (rc < 0 && errno != EINTR) {
            mt_log(MT_LOG_ERROR, "poll on the UCX event fd failed: %s", strerror(errno));
            break;
        }
    }
    /* Leftover work: failed ones whose sends never came back, or everything after an arm/poll
     * error. Waiters are woken; the transport frees the items once the worker is gone. */
    mt_work *w = tr->active;
    tr->active = NULL;
    while (w) {
        mt_work *next = w->next_active;
        if (!w->failing) mt_work_fail(w, MT_ERR_COMM, "the progress thread stopped");
        cancel_all(tr, w);
        if (!w->done_published) {
            w->done_published = true;
            publish(tr, w);
        }
        w->next_active = tr->zombies;
        tr->zombies = w;
        w = next;
    }
    return NULL;
}

mt_status mt_progress_start(mt_transport *tr) {
    int rc = pthread_create(&tr->thread, NULL, progress_main, tr);
    if (rc != 0) return mt_error_errno(MT_ERR_SYSTEM, rc, "starting the communication thread");
    tr->thread_started = true;
    return MT_OK;
}

void mt_progress_stop(mt_transport *tr) {
    if (!tr->thread_started) return;
    pthread_mutex_lock(&tr->mu);
    tr->stop = true;
    pthread_mutex_unlock(&tr->mu);
    ucp_worker_signal(tr->worker);
    pthread_join(tr->thread, NULL);
    tr->thread_started = false;
}

/* ---- work handles (user threads) ------------------------------------------------------------ */

static void deadline_after(struct timespec *ts, double seconds) {
    clock_gettime(CLOCK_REALTIME, ts);
    double whole = floor(seconds);
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static mt_status finished_status(mt_work *w) {
    if (w->status == MT_OK) return MT_OK;
    return mt_error(w->status, "%s", w->errmsg);
}

mt_status mt_work_wait(mt_work *w, double timeout_s) {
    if (!w) return mt_error(MT_ERR_INVALID_ARG, "mt_work_wait: work is NULL");
    if (w->nccl_op) return mt_nccl_work_wait(w, timeout_s);
    mt_transport *tr = w->tr;
    if (timeout_s < 0) timeout_s = mt_runtime_timeout(tr->rt);
    struct timespec deadline;
    deadline_after(&deadline, timeout_s);
    pthread_mutex_lock(&tr->mu);
    while (!w->done) {
        int rc = pthread_cond_timedwait(&tr->done_cv, &tr->mu, &deadline);
        if (rc == ETIMEDOUT && !w->done) break;
    }
    if (w->done) {
        mt_status st = finished_status(w);
        pthread_mutex_unlock(&tr->mu);
        return st;
    }
    mt_group *g = w->group;
    char prefix[160], msg[MT_ERRMSG_CAP], who[200];
    op_prefix(w, prefix, sizeof prefix);
    int peer = atomic_load(&w->waiting_peer);
    if (!w->started && g->running != NULL)
        snprintf(who, sizeof who, "an earlier operation on the group to finish");
    else if (peer >= 0)
        mt_describe_rank(tr, g->ranks[peer], who, sizeof who);
    else
        snprintf(who, sizeof who, "the operation to start");
    snprintf(msg, sizeof msg, "%s: timed out after %g s waiting for %s", prefix, timeout_s, who);
    if (!atomic_load(&g->failed)) {
        snprintf(g->fail_msg, sizeof g->fail_msg, "%s", msg);
        atomic_store(&g->failed, true);
    }
    atomic_store(&w->abort_requested, true);
    pthread_mutex_unlock(&tr->mu);
    ucp_worker_signal(tr->worker);
    return mt_error(MT_ERR_TIMEOUT, "%s", msg);
}

mt_status mt_work_test(mt_work *w, bool *done) {
    *done = false;
    if (!w) return mt_error(MT_ERR_INVALID_ARG, "mt_work_test: work is NULL");
    if (w->nccl_op) return mt_nccl_work_test(w, done);
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

void mt_work_free(mt_work *w) {
    if (!w) return;
    if (w->nccl_op) {
        mt_nccl_work_release(w);
        free(w->tasks);
        free(w);
        return;
    }
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
        /* An abandoned work completes as soon as the progress thread cancelled its receives. */
        pthread_mutex_lock(&tr->mu);
        while (!w->done) pthread_cond_wait(&tr->done_cv, &tr->mu);
        pthread_mutex_unlock(&tr->mu);
    }
    pthread_mutex_lock(&tr->mu);
    work_release_locked(w);
    pthread_mutex_unlock(&tr->mu);
}
