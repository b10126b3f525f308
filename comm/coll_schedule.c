/* The host backend's schedule engine (comm/schedule.h): an operation is a list of tasks (send,
 * recv, reduce, copy) with dependencies. The progress thread starts each task once its
 * dependencies are done, keeping at most `window` sends and `window` receives of an operation in
 * flight, and runs reductions and copies inline. Algorithms (coll_build.c) only describe the
 * list. */
#include "comm/flight_rec.h"
#include "comm/group.h"
#include "comm/host/shm.h"
#include "comm/host/ucx.h"
#include "comm/reduce.h"
#include "comm/schedule.h"
#include "comm/work.h"

#include "core/copy_stream.h"
#include "core/cpu/sum_squares.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

void mt_sched_init(mt_sched *s, mt_work *w, int expected_tasks) {
    s->w = w;
    s->oom = false;
    s->cap = expected_tasks > 0 ? expected_tasks : 1;
    w->ntasks = 0;
    w->tasks = malloc((size_t)s->cap * sizeof *w->tasks);
    if (!w->tasks) s->oom = true;
}

static mt_task *add(mt_sched *s, int *index) {
    *index = -1;
    if (s->oom) return NULL;
    mt_work *w = s->w;
    if (w->ntasks == s->cap) {
        int cap = s->cap * 2;
        mt_task *t = realloc(w->tasks, (size_t)cap * sizeof *t);
        if (!t) {
            s->oom = true;
            return NULL;
        }
        w->tasks = t;
        s->cap = cap;
    }
    *index = w->ntasks;
    mt_task *t = &w->tasks[w->ntasks++];
    memset(t, 0, sizeof *t);
    t->deps[0] = t->deps[1] = t->deps[2] = -1;
    t->consumer = -1;
    t->work = w;
    return t;
}

int mt_sched_send(mt_sched *s, int peer, uint32_t sub, const void *src, size_t bytes, int dep0,
                  int dep1) {
    int i;
    mt_task *t = add(s, &i);
    if (!t) return -1;
    t->kind = MT_TASK_SEND;
    t->peer = peer;
    t->sub = sub;
    t->src = src;
    t->bytes = bytes;
    t->deps[0] = dep0;
    t->deps[1] = dep1;
    return i;
}

int mt_sched_recv(mt_sched *s, int peer, uint32_t sub, void *dst, size_t bytes, int dep0,
                  int dep1) {
    int i;
    mt_task *t = add(s, &i);
    if (!t) return -1;
    t->kind = MT_TASK_RECV;
    t->peer = peer;
    t->sub = sub;
    t->dst = dst;
    t->bytes = bytes;
    t->deps[0] = dep0;
    t->deps[1] = dep1;
    return i;
}

/* A REDUCE whose second input is exactly what one of its RECV dependencies receives may read
 * the peer's shared memory in place of that copy (comm/host/shm.c). Not when it also waits for a
 * send: the peer's ack would then wait on our send, whose own ack waits on the next rank, around
 * the ring. */
static void mark_consumer(mt_sched *s, int index) {
    mt_work *w = s->w;
    mt_task *t = &w->tasks[index];
    int recv = -1;
    bool waits_for_send = false;
    for (int d = 0; d < 3; d++) {
        int dep = t->deps[d];
        if (dep < 0) continue;
        mt_task *u = &w->tasks[dep];
        if (u->kind == MT_TASK_SEND) waits_for_send = true;
        if (u->kind == MT_TASK_RECV && u->dst == t->src2 &&
            u->bytes == t->count * mt_dtype_size(w->dtype))
            recv = dep;
    }
    if (recv < 0) return;
    w->tasks[recv].feeds_reduce = 1;
    if (!waits_for_send) w->tasks[recv].consumer = index;
}

int mt_sched_reduce(mt_sched *s, bool final, void *dst, const void *a, const void *b,
                    size_t count, int dep0, int dep1, int dep2) {
    int i;
    mt_task *t = add(s, &i);
    if (!t) return -1;
    t->kind = MT_TASK_REDUCE;
    t->mode = final ? MT_REDUCE_MODE_FINAL : MT_REDUCE_MODE_PARTIAL;
    t->dst = dst;
    t->src = a;
    t->src2 = b;
    t->count = count;
    t->deps[0] = dep0;
    t->deps[1] = dep1;
    t->deps[2] = dep2;
    mark_consumer(s, i);
    return i;
}

int mt_sched_reduce_many(mt_sched *s, void *dst, const void *const *srcs, int nsrcs,
                         size_t count) {
    int i;
    mt_task *t = add(s, &i);
    if (!t) return -1;
    t->kind = MT_TASK_REDUCE_MANY;
    t->after_all = 1;
    t->dst = dst;
    t->srcs = srcs;
    t->peer = nsrcs;
    t->count = count;
    return i;
}

int mt_sched_reduce_peers(mt_sched *s, void *dst, const void *own, size_t count, int first_recv,
                          int recv_stride) {
    int i;
    mt_task *t = add(s, &i);
    if (!t) return -1;
    t->kind = MT_TASK_REDUCE_PEERS;
    t->dst = dst;
    t->src = own;
    t->count = count;
    t->first_recv = first_recv;
    t->recv_stride = recv_stride;
    /* It waits for no send, so reading the peers in place cannot close a cycle of acks. */
    mt_work *w = s->w;
    for (int k = 0; k < w->group->size - 1; k++) {
        mt_task *u = &w->tasks[first_recv + k * recv_stride];
        u->feeds_reduce = 1;
        u->consumer = i;
    }
    return i;
}

int mt_sched_copy(mt_sched *s, void *dst, const void *src, size_t bytes, bool after_all) {
    int i;
    mt_task *t = add(s, &i);
    if (!t) return -1;
    t->kind = MT_TASK_COPY;
    t->after_all = after_all;
    t->dst = dst;
    t->src = src;
    t->bytes = bytes;
    return i;
}

void mt_sched_squares(mt_sched *s, int task, size_t out_at) {
    mt_work *w = s->w;
    if (task < 0 || s->oom || !w->squares.partial || out_at >= w->squares.count) return;
    mt_task *t = &w->tasks[task];
    t->sq.partial = w->squares.partial + out_at / MT_SQ_CHUNK;
    t->sq.count = w->squares.count - out_at;
}

int mt_sched_squares_pass(mt_sched *s) {
    int i;
    mt_task *t = add(s, &i);
    if (!t) return -1;
    t->kind = MT_TASK_SQUARES;
    t->after_all = 1;
    return i;
}

mt_status mt_sched_finish(mt_sched *s) {
    if (s->oom)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "%s on group '%s': no memory for its schedule",
                        mt_op_name(s->w->kind), s->w->group->name);
    return MT_OK;
}

static bool ready(const mt_work *w, const mt_task *t, int index) {
    if (t->after_all && index != w->first_undone) return false;
    for (int d = 0; d < 3; d++)
        if (t->deps[d] >= 0 && w->tasks[t->deps[d]].state != MT_TASK_DONE) return false;
    if (t->kind == MT_TASK_REDUCE_PEERS)
        for (int k = 0; k < w->group->size - 1; k++)
            if (w->tasks[t->first_recv + k * t->recv_stride].state != MT_TASK_DONE) return false;
    return true;
}

/* REDUCE_PEERS: every member's input in group-rank order, each where it lies (a peer's shared
 * memory, or the slot its data was received into), then the acks of those read in place. */
static void reduce_peers(mt_work *w, mt_task *t) {
    int n = w->group->size, r = w->group->rank;
    const void *inputs[MT_REDUCE_PEERS_MAX];
    for (int j = 0; j < n; j++) {
        if (j == r) {
            inputs[j] = t->src;
            continue;
        }
        int back = ((r - j) % n + n) % n; /* from group rank r - back: the back-th RECV */
        const mt_task *u = &w->tasks[t->first_recv + (back - 1) * t->recv_stride];
        inputs[j] = u->shm.src ? u->shm.src : u->dst;
    }
    if (t->sq.partial) mt_reduce_many_squares(w->rop, n, inputs, t->dst, t->count, &t->sq);
    else mt_reduce_many(w->dtype, w->rop, n, inputs, t->dst, t->count);
    for (int k = 0; k < n - 1; k++) {
        mt_task *u = &w->tasks[t->first_recv + k * t->recv_stride];
        if (u->shm.src) mt_shm_release(w->tr, u);
    }
}

/* The RECV this REDUCE consumes in place (its data still in the peer's shared memory), or NULL. */
static mt_task *fed_by_peer(mt_work *w, int index) {
    const mt_task *t = &w->tasks[index];
    for (int d = 0; d < 3; d++) {
        if (t->deps[d] < 0) continue;
        mt_task *u = &w->tasks[t->deps[d]];
        if (u->kind == MT_TASK_RECV && u->consumer == index && u->shm.src) return u;
    }
    return NULL;
}

static void run_inline(mt_work *w, mt_task *t, int index) {
    switch (t->kind) {
    case MT_TASK_REDUCE: {
        mt_task *fed = fed_by_peer(w, index);
        const void *b = fed ? fed->shm.src : t->src2;
        if (t->sq.partial)
            mt_reduce_pair_squares(w->rop, w->group->size, t->dst, t->src, b, t->count, &t->sq);
        else
            mt_reduce_pair(w->dtype, w->rop, t->mode == MT_REDUCE_MODE_FINAL, w->group->size,
                           t->dst, t->src, b, t->count);
        if (fed) mt_shm_release(w->tr, fed);
        break;
    }
    case MT_TASK_REDUCE_MANY:
        if (t->sq.partial)
            mt_reduce_many_squares(w->rop, t->peer, t->srcs, t->dst, t->count, &t->sq);
        else
            mt_reduce_many(w->dtype, w->rop, t->peer, t->srcs, t->dst, t->count);
        break;
    case MT_TASK_REDUCE_PEERS:
        reduce_peers(w, t);
        break;
    case MT_TASK_SQUARES: /* only scheduled when the work asked for them (coll_build.c) */
        mt_reduce_squares_of(w->recv, &w->squares);
        break;
    case MT_TASK_COPY: {
        const char *d = t->dst, *src = t->src;
        bool overlap = d < src + t->bytes && src < d + t->bytes;
        if (t->bytes && d != src) {
            if (overlap) memmove(t->dst, t->src, t->bytes);
            else mt_copy_stream(t->dst, t->src, t->bytes);
        }
        break;
    }
    default:
        break;
    }
    t->state = MT_TASK_DONE;
}

/* How far past the first unfinished task the engine looks for startable work: enough for a
 * window of chunks of the current ring step and the next. */
static int lookahead(const mt_work *w) {
    int window = w->window > 0 ? w->window : w->tr->window;
    return 16 + 8 * window;
}

bool mt_schedule_advance(mt_work *w) {
    bool changed = false;
    int window = w->window > 0 ? w->window : w->tr->window;
    for (;;) {
        bool again = false;
        while (w->first_undone < w->ntasks && w->tasks[w->first_undone].state == MT_TASK_DONE)
            w->first_undone++;
        int end = w->first_undone + lookahead(w);
        if (end > w->ntasks) end = w->ntasks;
        int waiting_recv = -1, waiting_send = -1;
        for (int i = w->first_undone; i < end && !w->failing; i++) {
            mt_task *t = &w->tasks[i];
            if (t->state == MT_TASK_POSTED) {
                if (t->kind == MT_TASK_RECV && waiting_recv < 0) waiting_recv = t->peer;
                if (t->kind == MT_TASK_SEND && waiting_send < 0) waiting_send = t->peer;
                continue;
            }
            if (t->state != MT_TASK_IDLE || !ready(w, t, i)) continue;
            if (t->kind == MT_TASK_SEND || t->kind == MT_TASK_RECV) {
                int *inflight = t->kind == MT_TASK_SEND ? &w->inflight_send : &w->inflight_recv;
                if (*inflight >= window) continue;
                mt_transport_post(w->tr, t);
                changed = true;
                if (t->state == MT_TASK_DONE) again = true;
                else if (t->kind == MT_TASK_RECV && waiting_recv < 0) waiting_recv = t->peer;
                else if (t->kind == MT_TASK_SEND && waiting_send < 0) waiting_send = t->peer;
            } else {
                run_inline(w, t, i);
                changed = true;
                again = true;
            }
        }
        int peer = waiting_recv >= 0 ? waiting_recv : waiting_send;
        atomic_store(&w->waiting_peer, peer);
        mt_fr_waiting(w, peer);
        if (!again || w->failing) break;
    }
    while (w->first_undone < w->ntasks && w->tasks[w->first_undone].state == MT_TASK_DONE)
        w->first_undone++;
    return changed;
}
