/* Internal: the state shared by the UCX transport, its progress thread, groups and collectives.
 *
 * Threading: user threads only build work items, queue them (transport->mu) and call
 * ucp_worker_signal; everything that touches the UCX worker, endpoints or a running operation's
 * schedule runs on the progress thread. Completion is published under transport->mu and waiters
 * sleep on transport->done_cv.
 */
#ifndef MT_MESH_TRANSPORT_INTERNAL_H
#define MT_MESH_TRANSPORT_INTERNAL_H

#include "comm/transport.h"

#include "core/shm_block.h"

#include <meshtrain/comm.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

/* Tag layout (64 bits): group id 16 | p2p 1 | sequence 15 | sender group rank 12 | desc 1 |
 * ack 1 | sub 18. Different groups, operations, senders and chunks never match each other. The
 * desc bit marks a shared-memory descriptor sent instead of the data (comm/host/shm.c): receives
 * ignore it so that either form matches; the ack bit marks the receiver's reply to one. */
#define MT_TAG_GROUP_SHIFT 48
#define MT_TAG_P2P_BIT (UINT64_C(1) << 47)
#define MT_TAG_SEQ_SHIFT 32
#define MT_TAG_SEQ_MASK 0x7fffu
#define MT_TAG_SRC_SHIFT 20
#define MT_TAG_SRC_MASK 0xfffu
#define MT_TAG_SUB_MASK 0x3ffffu
#define MT_TAG_ACK_BIT (UINT64_C(1) << 18)
#define MT_TAG_DESC_BIT (UINT64_C(1) << 19)
#define MT_GROUP_MAX_RANKS 4096

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

typedef enum mt_task_kind {
    MT_TASK_SEND,
    MT_TASK_RECV,
    MT_TASK_REDUCE,      /* dst = src (op) src2 */
    MT_TASK_REDUCE_MANY, /* dst = reduction of srcs[0..peer-1] in order */
    MT_TASK_COPY         /* bytes from src to dst; 0 bytes = a join point */
} mt_task_kind;

/* How a REDUCE task combines its inputs; see comm/reduce.h. */
typedef enum mt_reduce_mode { MT_REDUCE_MODE_PARTIAL, MT_REDUCE_MODE_FINAL } mt_reduce_mode;

enum { MT_TASK_IDLE = 0, MT_TASK_POSTED, MT_TASK_DONE };

/* One step of an operation's schedule. An operation is a list of tasks; a task starts once the
 * tasks it depends on are done (deps, or every earlier task when after_all is set). */
typedef struct mt_task {
    uint8_t kind;
    uint8_t state;
    uint8_t after_all;
    uint8_t mode;   /* REDUCE: mt_reduce_mode */
    int deps[3];    /* task indices, -1 = none */
    int peer;       /* SEND/RECV: group rank */
    uint32_t sub;   /* SEND/RECV: sub-tag */
    void *dst;      /* RECV/REDUCE/COPY destination */
    const void *src;  /* SEND/COPY source; REDUCE: first input (may be in the user's send) */
    const void *src2; /* REDUCE: second input (received data) */
    const void *const *srcs; /* REDUCE_MANY inputs (peer = how many) */
    size_t count;   /* elements (REDUCE/COPY) */
    size_t bytes;   /* SEND/RECV */
    void *req;      /* UCX request while posted */
    struct mt_work *work;
    ucs_status_t ucs;
    /* SEND through shared memory (comm/host/shm.c): the descriptor sent instead of the data, the
     * receiver's ack, and the two requests (descriptor send, ack recv) still to complete. */
    mt_shm_ref shm_desc;
    void *ack_req;
    uint8_t ack_byte;
    uint8_t shm_parts;
    ucs_status_t shm_status;
    /* RECV: the REDUCE task that alone reads dst (-1: none). When a descriptor arrives for such a
     * receive, the reduction reads the peer's mapped bytes (shm_src) instead of a copy, and the
     * ack waits until it ran (mt_shm_release). */
    int consumer;
    const void *shm_src;
    uint8_t feeds_reduce; /* RECV: a REDUCE reads dst next (keep the copy in cache) */
} mt_task;

typedef struct mt_transport mt_transport;
struct mt_nccl_comm;
struct mt_nccl_op;

struct mt_work {
    mt_op_kind kind;
    mt_group *group;
    mt_transport *tr;
    /* parameters */
    const void *send;
    void *recv;
    size_t count;
    mt_dtype dtype;
    mt_reduce_op rop;
    int root; /* broadcast root, or send/recv peer (group ranks) */
    uint32_t seq;

    /* progress-thread state */
    mt_task *tasks;
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

    /* shared (under tr->mu unless atomic) */
    atomic_int waiting_peer; /* group rank the schedule waits on, -1 unknown */
    atomic_bool abort_requested;
    bool done;
    mt_status status;
    char errmsg[MT_ERRMSG_CAP];
    int refs; /* user handle + progress thread */
    /* Set when the work runs on the group's NCCL communicator (comm/nccl/nccl_coll.c): it never goes
     * to the progress thread, and wait/test/free go to NCCL's event instead. */
    struct mt_nccl_op *nccl_op;
};

struct mt_group {
    mt_transport *tr;
    mt_runtime *rt;
    char name[64];
    int size;
    int rank;      /* this process's group rank */
    int *ranks;    /* global ranks */
    uint32_t id;   /* 16-bit tag space */
    bool is_world;
    uint32_t next_seq;        /* collectives issued (user threads, under tr->mu) */
    uint32_t *p2p_send_seq;   /* per peer, under tr->mu */
    uint32_t *p2p_recv_seq;
    /* progress thread only */
    struct mt_work *fifo_head, *fifo_tail; /* collectives not started yet */
    struct mt_work *running;               /* the collective that runs now */
    void *scratch; /* reused by the group's collectives */
    mt_device *scratch_device; /* where scratch came from; NULL = host memory */
    size_t scratch_bytes;
    bool in_ready_list;
    struct mt_group *next_ready;
    /* failure: set once under tr->mu */
    atomic_bool failed;
    char fail_msg[MT_ERRMSG_CAP];
    int pending; /* queued or running work, under tr->mu (destroy waits for 0) */
    /* The mesh dimension's NCCL communicator (comm/nccl/nccl_comm.h), or NULL: GPU buffers given to
     * this group's collectives go through it. Owned by the mesh. */
    struct mt_nccl_comm *nccl;
};

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

    /* progress thread only */
    struct mt_work *active;     /* running operations (collectives heads and p2p) */
    struct mt_group *ready;     /* groups whose FIFO may start a collective */
    struct mt_work *zombies;    /* failed work left when the thread stopped */
    size_t chunk_bytes;
    int window;
    size_t small_bytes;

    /* shared-memory path between ranks of one host (comm/host/shm.c) */
    bool shm_enabled;       /* MT_COMM_SHM != 0 */
    size_t shm_min_bytes;   /* messages at least this large may go through it */
    bool *same_host;        /* per global rank */
    int *shm_pidfds;        /* per global rank, -1 until needed (progress thread) */
    struct mt_shm_map *shm_maps; /* peers' blocks mapped here (progress thread) */
    int shm_nmaps;
    uint64_t shm_clock;

    mt_membership_count *memberships; /* under mu */
    mt_group *world_group;
};

/* progress.c */
mt_status mt_progress_start(mt_transport *tr);
void mt_progress_stop(mt_transport *tr);
/* Frees failed work the stopped thread left behind (after the worker is destroyed). */
void mt_progress_free_zombies(mt_transport *tr);
/* Queues work for the progress thread (takes ownership of one reference). */
mt_status mt_progress_submit(mt_transport *tr, struct mt_work *work);
/* Allocates a work item with two references (the caller's handle and the progress thread). */
struct mt_work *mt_work_new(mt_group *group, mt_op_kind kind);
/* Submits work to the progress thread (not work mt_nccl_enqueue queued) and either returns the
 * handle or waits for it when out is NULL. */
mt_status mt_work_submit_or_wait(struct mt_work *work, mt_work **out);
const char *mt_op_name(mt_op_kind kind);
/* Records a failure on a running work (progress thread). */
void mt_work_fail(struct mt_work *work, mt_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* coll_build.c: builds the task list of a work item (progress thread, when it starts). */
mt_status mt_schedule_build(struct mt_work *work);

/* coll_schedule.c: the task list. */
typedef struct mt_sched {
    struct mt_work *w;
    int cap;
    bool oom;
} mt_sched;
void mt_sched_init(mt_sched *s, struct mt_work *w, int expected_tasks);
int mt_sched_send(mt_sched *s, int peer, uint32_t sub, const void *src, size_t bytes, int dep0,
                  int dep1);
int mt_sched_recv(mt_sched *s, int peer, uint32_t sub, void *dst, size_t bytes, int dep0,
                  int dep1);
int mt_sched_reduce(mt_sched *s, bool final, void *dst, const void *a, const void *b,
                    size_t count, int dep0, int dep1, int dep2);
/* Runs after every earlier task. */
int mt_sched_reduce_many(mt_sched *s, void *dst, const void *const *srcs, int nsrcs,
                         size_t count);
int mt_sched_copy(mt_sched *s, void *dst, const void *src, size_t bytes, bool after_all);
mt_status mt_sched_finish(mt_sched *s);
/* Posts/executes whatever tasks are ready; returns true when anything changed. */
bool mt_schedule_advance(struct mt_work *work);

/* comm/host/ucx.c */
uint64_t mt_tag_make(const mt_group *group, bool p2p, uint32_t seq, int src, uint32_t sub);
/* Posts a task's message on the worker (progress thread). */
mt_status mt_transport_post(mt_transport *tr, mt_task *task);
void mt_transport_cancel(mt_transport *tr, mt_task *task);
/* Describes a global rank for messages: "rank 2 (host x/0)". */
void mt_describe_rank(mt_transport *tr, int global_rank, char *out, size_t cap);

/* Marks a SEND/RECV task finished (progress thread): counters, and the work's failure. */
void mt_task_done(mt_task *task, ucs_status_t status);

/* comm/host/shm.c */
mt_status mt_shm_init(mt_transport *tr);
void mt_shm_close(mt_transport *tr);
/* Posts a SEND task as a descriptor + ack when its peer is on this host and its bytes lie in a
 * shared block; returns false (nothing posted) when the task must go as plain data. */
bool mt_shm_try_send(mt_transport *tr, mt_task *task, uint64_t tag, int peer_global);
/* A RECV task received a descriptor of `length` bytes: map, copy, ack. Returns the status the
 * task completes with. */
ucs_status_t mt_shm_receive(mt_transport *tr, mt_task *task, size_t length);
/* The consumer of a deferred receive ran: ack the peer (progress thread). */
void mt_shm_release(mt_transport *tr, mt_task *recv_task);
/* The receive mask of a RECV task: descriptors match too when one fits in its buffer. */
uint64_t mt_shm_recv_mask(const mt_task *task);

/* coll_build.c: releases a group's scratch. */
void mt_group_free_scratch(mt_group *group);

/* group.c */
mt_status mt_group_check_usable(mt_group *group, const char *op);
/* Makes the group unusable with msg (the first failure wins); takes tr->mu. */
void mt_group_mark_failed(mt_group *group, const char *msg);
mt_group *mt_group_alloc(mt_transport *tr, const int *ranks, int nranks, const char *name);
void mt_group_free(mt_group *group);

#endif
