/* Internal: a work handle (mt_work), the operation kinds and the generic work API.
 *
 * A work is one collective or point-to-point operation issued on a group. The generic part
 * (kind, arguments, the handle's references) is filled in by comm/coll_api.c; the backend the
 * work runs on (comm/backend.h, w->backend) owns the rest: the host backend's schedule and
 * completion fields below, or the NCCL backend's state behind backend_data. mt_work_wait,
 * mt_work_test and mt_work_free (include/meshtrain/comm.h) dispatch through w->backend.
 */
#ifndef MT_COMM_WORK_H
#define MT_COMM_WORK_H

#include "comm/reduce.h"
#include "comm/transport.h"

#include <meshtrain/comm.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Room for an error message kept on a work or a group (the operation, the group, the reason). */
#define MT_ERRMSG_CAP 768

typedef enum mt_op_kind {
    MT_OP_ALL_GATHER,
    MT_OP_REDUCE_SCATTER,
    MT_OP_ALL_REDUCE,
    MT_OP_BROADCAST,
    MT_OP_BARRIER,
    MT_OP_SEND,
    MT_OP_RECV,
} mt_op_kind;

struct mt_comm_backend;
struct mt_task;

struct mt_work {
    /* what to do (set before submit; read-only afterwards) */
    mt_op_kind kind;
    mt_group *group;
    mt_transport *tr;
    const void *send;
    void *recv;
    size_t count;
    mt_dtype dtype;
    mt_reduce_op rop;
    int root; /* broadcast root, or send/recv peer (group ranks) */
    uint64_t payload; /* bytes counted on the group's traffic counters once launched */
    uint64_t fr_id;   /* its flight recorder record's id + 1; 0: not recorded (comm/flight_rec.h) */
    /* A reduce-scatter's sums of squares of its output (comm/coll_squares.h): partial NULL when
     * none were asked. */
    mt_reduce_squares squares;
    /* The backend that carries it (mt_comm_select_backend), and that backend's own state (the
     * NCCL backend's operation; unused by the host backend). */
    const struct mt_comm_backend *backend;
    void *backend_data;
    atomic_int refs; /* the user's handle, plus one for the progress thread while it holds it */

    /* host backend, progress thread: the schedule (comm/schedule.h) */
    uint32_t seq;
    struct mt_task *tasks; /* freed with the work */
    int ntasks;
    int first_undone;
    int inflight_send, inflight_recv; /* posted, not completed */
    int window;                       /* most sends (and recvs) in flight */
    bool started;
    bool failing; /* an error was recorded; draining outstanding requests */
    bool done_published;
    bool cancelled;
    struct mt_work *next;    /* queue / group FIFO / active list */
    struct mt_work *next_active;

    /* host backend, shared with waiters (under tr->mu unless atomic) */
    atomic_int waiting_peer; /* group rank the schedule waits on, -1 unknown */
    atomic_bool abort_requested;
    bool done;
    mt_status status;
    char errmsg[MT_ERRMSG_CAP];
};

/* Allocates a work of kind on group for backend, holding one reference (the caller's handle). */
mt_work *mt_work_new(mt_group *group, mt_op_kind kind, const struct mt_comm_backend *backend);

/* Drops one reference; the last one frees the work (and its schedule). Thread-safe. */
void mt_work_unref(mt_work *work);

/* Hands the work to its backend and, once the backend took it, counts it (kind, payload) on its
 * group's traffic counters (comm/counters.c); then returns the handle in *out, or waits for it
 * and frees it when out is NULL. When the backend refuses it the work is freed, nothing is
 * counted and the error returned. MT_TEST_COLL_LAUNCH_FAIL=1 makes every launch fail so, before
 * the backend sees it (for tests of the callers' error paths and of the counters). */
mt_status mt_work_submit_or_wait(mt_work *work, mt_work **out);
/* MT_TEST_COLL_LAUNCH_FAIL is read once, at the first launch (not per launch: getenv scans
 * environ and races a concurrent setenv); tests turn the failure on and off with this. */
void mt_work_inject_launch_failure(bool on);

/* "all_reduce", "send", ...: the operation's name in messages. */
const char *mt_op_name(mt_op_kind kind);

/* "all_reduce on group 'tp' (2 ranks)": how messages about the work begin. */
void mt_work_describe(const mt_work *work, char *out, size_t cap);

/* Records a failure on a running host-backend work (progress thread); the first one wins. */
void mt_work_fail(mt_work *work, mt_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
