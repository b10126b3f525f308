/* Internal: the shared-memory path between ranks of one host (comm/host/shm.c): a send whose
 * bytes lie in a memfd-backed block goes to a local peer as a descriptor, which the receiver maps
 * and reads. Progress thread only, except mt_shm_init/close (transport creation and teardown). */
#ifndef MT_COMM_HOST_SHM_H
#define MT_COMM_HOST_SHM_H

#include "comm/transport.h"

#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ucs/type/status.h>

struct mt_task;
struct mt_shm_map;

/* The path's state, kept in the transport (tr->shm). */
typedef struct mt_shm_path {
    bool enabled;          /* MT_COMM_SHM != 0 */
    bool inject_eperm;     /* MT_TEST_PIDFD_GETFD_FAIL=EPERM, read once in mt_shm_init */
    size_t min_bytes;      /* messages at least this large may go through it */
    bool *same_host;       /* per global rank */
    int *pidfds;           /* per global rank, -1 until needed (progress thread) */
    struct mt_shm_map *maps; /* peers' blocks mapped here (progress thread) */
    int nmaps;
    uint64_t clock;
} mt_shm_path;

mt_status mt_shm_init(mt_transport *tr);
void mt_shm_close(mt_transport *tr);
/* Posts a SEND task as a descriptor + ack when its peer is on this host and its bytes lie in a
 * shared block; returns false (nothing posted) when the task must go as plain data. */
bool mt_shm_try_send(mt_transport *tr, struct mt_task *task, uint64_t tag, int peer_global);
/* A RECV task received a descriptor of `length` bytes: map, copy, ack. Returns the status the
 * task completes with. */
ucs_status_t mt_shm_receive(mt_transport *tr, struct mt_task *task, size_t length);
/* The consumer of a deferred receive ran: ack the peer (progress thread). */
void mt_shm_release(mt_transport *tr, struct mt_task *recv_task);
/* The receive mask of a RECV task: descriptors match too when one fits in its buffer. */
uint64_t mt_shm_recv_mask(const struct mt_task *task);

#endif
