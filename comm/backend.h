/* Internal: a communication backend, the table of what one carrier of work does with it (in the
 * manner of NCCL's transport tables), and the one place that picks a backend for an operation.
 *
 * Two backends exist: the host backend (comm/host/host_backend.c: the progress thread of
 * comm/progress.c running schedules over UCX and shared memory) and, in NCCL builds only, the
 * NCCL backend (comm/nccl/nccl_coll.c: the group's NCCL communicator, for GPU buffers). The
 * generic work code (comm/work.c) owns a work's allocation, references and the public entry
 * points, and reaches the backend only through w->backend.
 *
 * Entries are called from user threads (never the progress thread) and never with a NULL work.
 * Like the handle they serve, they are not made for concurrent calls on one work: the NCCL
 * backend's state has no lock.
 */
#ifndef MT_COMM_BACKEND_H
#define MT_COMM_BACKEND_H

#include "comm/work.h"

#include <meshtrain/comm.h>

#include <stdbool.h>
#include <stddef.h>

typedef struct mt_comm_backend {
    const char *name; /* "host", "nccl" */
    /* Starts the work (kind and arguments set, one reference: the caller's). On error nothing
     * was started and the backend holds nothing of it: the caller frees the work. */
    mt_status (*submit)(mt_work *work);
    /* Polls once: *done is set once the work finished, and its error is returned when it
     * failed; MT_OK with *done false while it runs. Never blocks on peers. */
    mt_status (*test)(mt_work *work, bool *done);
    /* Waits until the work finishes, for at most timeout_s (< 0: the runtime's MT_TIMEOUT_S),
     * and returns its result. MT_ERR_TIMEOUT when the time ran out first, with a message naming
     * the operation, the group and what it waited for; the group (host) or the communicator
     * (NCCL) is then failed, and mt_work_wait calls cancel. */
    mt_status (*wait)(mt_work *work, double timeout_s);
    /* Abandons the work after a waiter timed out: it must finish soon, with an error, without
     * waiting for peers any longer. Host: asks the progress thread to fail it and cancel its
     * requests (the waiter's timeout already made the group unusable). NCCL: nothing left to do,
     * since its wait aborted the communicator before reporting the timeout. Harmless on a work
     * that already finished, and when called twice. */
    void (*cancel)(mt_work *work);
    /* The user frees the handle: returns once the backend no longer touches the work's buffers
     * (an unfinished work is waited for with mt_work_wait, then, when abandoned, until it
     * finished) and has dropped its own state. The generic code then drops the handle's
     * reference; the work itself is freed by mt_work_unref. */
    void (*release)(mt_work *work);
} mt_comm_backend;

extern const mt_comm_backend mt_host_backend;
#ifdef MT_HAVE_NCCL
extern const mt_comm_backend mt_nccl_backend;
#endif

/* Picks the backend for an operation of kind on group with buffers a and b (either may be NULL)
 * of count elements: the NCCL backend when the buffers are GPU memory and the group has a
 * communicator (mt_nccl_route), the host backend otherwise. Every member routes alike, so an
 * empty operation (where a member may pass NULL) always takes the host backend. GPU buffers the
 * NCCL backend cannot take, or host and GPU buffers mixed, are an error naming the operation and
 * the group. comm/backend.c. */
mt_status mt_comm_select_backend(mt_group *group, mt_op_kind kind, const void *a, const void *b,
                                 size_t count, const mt_comm_backend **out);

#endif
