/* Internal: the UCX host transport (comm/host/ucx.c): the transport object, the tag layout of
 * its messages and posting a schedule's messages on the worker.
 *
 * Threading: user threads only build work items, queue them (transport->mu) and call
 * ucp_worker_signal; everything that touches the UCX worker, endpoints or a running operation's
 * schedule runs on the progress thread (comm/progress.h). Completion is published under
 * transport->mu and waiters sleep on transport->done_cv.
 */
#ifndef MT_COMM_HOST_UCX_H
#define MT_COMM_HOST_UCX_H

#include "comm/host/shm.h"
#include "comm/transport.h"

#include <meshtrain/comm.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

struct mt_task;

/* Tag layout (64 bits): group id 16 | operation 3 | sequence 13 | sender group rank 12 | desc 1 |
 * ack 1 | sub 18. Different groups, operations, senders and chunks never match each other. The
 * operation (all_gather, reduce_scatter, ..., or point-to-point) is in the tag so that ranks that
 * disagree on what their n-th collective of a group is wait, and their timeout and the flight
 * recorder say so, instead of exchanging same-sized messages and completing with wrong data. The
 * desc bit marks a shared-memory descriptor sent instead of the data (comm/host/shm.c): receives
 * ignore it so that either form matches; the ack bit marks the receiver's reply to one. The
 * sequence wraps at 8192: operations of one group 8192 apart share a tag, so no member may run
 * that far ahead of another in a group (a collective cannot complete without every member; a
 * point-to-point sender 8192 unreceived messages ahead would be matched by UCX in order only). */
#define MT_TAG_GROUP_SHIFT 48
#define MT_TAG_OP_SHIFT 45
#define MT_TAG_OP_MASK 0x7u
#define MT_TAG_SEQ_SHIFT 32
#define MT_TAG_SEQ_MASK 0x1fffu
#define MT_TAG_SRC_SHIFT 20
#define MT_TAG_SRC_MASK 0xfffu
#define MT_TAG_SUB_MASK 0x3ffffu
#define MT_TAG_ACK_BIT (UINT64_C(1) << 18)
#define MT_TAG_DESC_BIT (UINT64_C(1) << 19)
/* The sender's group rank has 12 bits of the tag. */
#define MT_GROUP_MAX_RANKS 4096

/* Groups created per (membership, name), so that members agree on each group's store key. */
typedef struct mt_membership_count {
    uint64_t hash;
    char name[64];
    int count;
    struct mt_membership_count *next;
} mt_membership_count;

struct mt_transport {
    mt_runtime *rt;
    int rank, world;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h *eps;
    ucs_status_t *ep_status; /* progress thread: UCS_OK or the error the endpoint reported */
    void *ep_args;           /* per-peer context of the endpoint error callbacks */
    int efd;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t done_cv;
    struct mt_work *queue_head, *queue_tail; /* submitted, not seen by the progress thread */
    bool stop;
    /* Set when an abandoned work's cancellation never finished (host_release): UCX may still
     * write into that work's buffers, so no later operation may run on this transport. */
    atomic_bool broken;
    char broken_msg[256]; /* written once, before broken is set */

    /* progress thread only */
    struct mt_work *active;     /* running operations (collectives heads and p2p) */
    struct mt_group *ready;     /* groups whose FIFO may start a collective */
    struct mt_work *zombies;    /* failed work left when the thread stopped */
    size_t chunk_bytes;
    int window;
    size_t small_bytes;
    /* MT_COMM_LOCAL_DIRECT_RS (default 1): a reduce-scatter among 3 or more ranks of one host
     * that read each other's memory sums every input in one pass (coll_build.c) instead of a
     * ring; 0 keeps the ring. */
    bool local_direct_rs;

    mt_shm_path shm; /* shared-memory path between ranks of one host (comm/host/shm.c) */

    mt_membership_count *memberships; /* under mu */
    mt_group *world_group;
};

uint64_t mt_tag_make(const struct mt_work *w, int src, uint32_t sub);
/* Posts a task's message on the worker (progress thread). */
mt_status mt_transport_post(mt_transport *tr, struct mt_task *task);
/* Cancels a task's outstanding requests (progress thread, failing work). */
void mt_transport_cancel(mt_transport *tr, struct mt_task *task);
/* Marks a SEND/RECV task finished (progress thread): counters, and the work's failure. */
void mt_task_done(struct mt_task *task, ucs_status_t status);
/* Describes a global rank for messages: "rank 2 (host x/0)". */
void mt_describe_rank(mt_transport *tr, int global_rank, char *out, size_t cap);

#endif
