/* The host backend's communication progress thread.
 *
 * User threads queue work under tr->mu and wake the thread with ucp_worker_signal (documented as
 * safe from any thread; comm/host/host_backend.c). The thread moves queued work to its groups,
 * runs each group's collectives one after another (point-to-point work runs as soon as it
 * arrives, so that a send and a recv queued on one group cannot block each other), drives the
 * worker, and when nothing moves it arms the worker and sleeps in poll() on the worker's event
 * fd. The poll timeout only bounds how late a stop or abort request is seen; it is not a polling
 * loop.
 */
#include "comm/flight_rec.h"
#include "comm/group.h"
#include "comm/host/ucx.h"
#include "comm/progress.h"
#include "comm/schedule.h"
#include "comm/work.h"

#include "core/error.h"
#include "core/thread_name.h"

#include <meshtrain/log.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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
    mt_fr_started(w);
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
 * given back every request of the work (mt_work_unref in advance_active). */
static void publish(mt_transport *tr, mt_work *w) {
    mt_group *g = w->group;
    if (g->running == w) {
        g->running = NULL;
        if (g->fifo_head) group_ready(tr, g);
    }
    pthread_mutex_lock(&tr->mu);
    if (w->failing) {
        if (w->status == MT_OK) w->status = MT_ERR_INTERNAL;
        /* mt_finalize then does not wait for ranks out of step */
        mt_failure_note_comm(w->status, w->errmsg);
        if (!atomic_load(&g->failed)) {
            snprintf(g->fail_msg, sizeof g->fail_msg, "%s", w->errmsg);
            atomic_store(&g->failed, true);
        }
    }
    w->done = true;
    mt_fr_completed(w, w->status);
    g->pending--;
    pthread_cond_broadcast(&tr->done_cv);
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
            mt_work_unref(w);
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
        mt_work_unref(w);
    }
}

/* Leaves a work for the transport to free once the worker is gone, its waiter woken. */
static void bury(mt_transport *tr, mt_work *w) {
    if (!w->done_published) {
        w->done_published = true;
        publish(tr, w);
    }
    w->next_active = tr->zombies;
    tr->zombies = w;
}

/* Work that never started when the thread stops: still queued, or waiting in a group's FIFO
 * behind a running collective. After an arm/poll error nobody would ever run it, and its waiter
 * would wait for MT_TIMEOUT_S and then for ever. */
static void fail_unstarted(mt_transport *tr, mt_work *w) {
    while (w) {
        mt_work *next = w->next;
        w->next = NULL;
        mt_work_fail(w, MT_ERR_COMM, "the communication thread stopped before it started");
        bury(tr, w);
        w = next;
    }
}

static void fail_group_fifo(mt_transport *tr, mt_group *g) {
    mt_work *w = g->fifo_head;
    g->fifo_head = g->fifo_tail = NULL;
    fail_unstarted(tr, w);
}

static void *progress_main(void *arg) {
    mt_name_this_thread("mt-comm");
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
    /* From here on nothing is accepted (after an arm/poll error the user did not ask to stop). */
    pthread_mutex_lock(&tr->mu);
    tr->stop = true;
    mt_work *queued = tr->queue_head;
    tr->queue_head = tr->queue_tail = NULL;
    pthread_mutex_unlock(&tr->mu);
    fail_unstarted(tr, queued);
    for (mt_group *g = tr->ready, *next; g; g = next) {
        next = g->next_ready;
        g->in_ready_list = false;
        g->next_ready = NULL;
        fail_group_fifo(tr, g);
    }
    tr->ready = NULL;
    for (mt_work *a = tr->active; a; a = a->next_active) fail_group_fifo(tr, a->group);
    /* Leftover work: failed ones whose sends never came back, or everything after an arm/poll
     * error. Waiters are woken; the transport frees the items once the worker is gone. */
    mt_work *w = tr->active;
    tr->active = NULL;
    while (w) {
        mt_work *next = w->next_active;
        if (!w->failing) mt_work_fail(w, MT_ERR_COMM, "the progress thread stopped");
        cancel_all(tr, w);
        bury(tr, w);
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

double mt_progress_cpu_s(mt_transport *tr) {
    clockid_t clock;
    struct timespec ts;
    if (!tr || !tr->thread_started || pthread_getcpuclockid(tr->thread, &clock) != 0 ||
        clock_gettime(clock, &ts) != 0)
        return -1.0;
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
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
