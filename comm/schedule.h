/* Internal: the host backend's schedules. An operation is a list of tasks (send, recv, reduce,
 * copy) with dependencies; comm/coll_build.c writes the list for each algorithm through the
 * mt_sched_* calls, and comm/coll_schedule.c runs it on the progress thread, posting messages
 * through the UCX transport (comm/host/ucx.h) and running reductions and copies inline. */
#ifndef MT_COMM_SCHEDULE_H
#define MT_COMM_SCHEDULE_H

#include "comm/work.h"

#include "core/shm_block.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ucs/type/status.h>

/* The most members a REDUCE_PEERS task reduces (its inputs' table lives on the stack). */
#define MT_REDUCE_PEERS_MAX 64

typedef enum mt_task_kind {
    MT_TASK_SEND,
    MT_TASK_RECV,
    MT_TASK_REDUCE,      /* dst = src (op) src2 */
    MT_TASK_REDUCE_MANY, /* dst = reduction of srcs[0..peer-1] in order */
    MT_TASK_REDUCE_PEERS, /* dst = reduction, in group-rank order, of src (this rank's input)
                             and what the RECVs first_recv, first_recv + recv_stride, ... (one
                             per other member) received, read where it lies (shared memory) */
    MT_TASK_COPY,        /* bytes from src to dst; 0 bytes = a join point */
    MT_TASK_SQUARES      /* after every other task: the work's sums of squares of its output */
} mt_task_kind;

/* How a REDUCE task combines its inputs; see comm/reduce.h. */
typedef enum mt_reduce_mode { MT_REDUCE_MODE_PARTIAL, MT_REDUCE_MODE_FINAL } mt_reduce_mode;

enum { MT_TASK_IDLE = 0, MT_TASK_POSTED, MT_TASK_DONE };

/* One step of an operation's schedule. A task starts once the tasks it depends on are done
 * (deps, or every earlier task when after_all is set). */
typedef struct mt_task {
    /* the schedule */
    uint8_t kind;
    uint8_t state;
    uint8_t after_all;
    int deps[3];    /* task indices, -1 = none */
    struct mt_work *work;
    /* what it moves */
    int peer;       /* SEND/RECV: group rank */
    uint32_t sub;   /* SEND/RECV: sub-tag */
    void *dst;      /* RECV/REDUCE/COPY destination */
    const void *src;  /* SEND/COPY source; REDUCE: first input (may be in the user's send) */
    size_t count;   /* elements (REDUCE/COPY) */
    size_t bytes;   /* SEND/RECV */
    /* reduction */
    uint8_t mode;   /* REDUCE: mt_reduce_mode */
    const void *src2; /* REDUCE: second input (received data) */
    const void *const *srcs; /* REDUCE_MANY inputs (peer = how many) */
    int first_recv, recv_stride; /* REDUCE_PEERS: its RECV tasks, from group rank r-1, r-2, ... */
    mt_reduce_squares sq; /* final f32 reduction: the sums of squares of what it writes */
    /* RECV: who reads what it received. consumer is the REDUCE task that alone reads dst (-1:
     * none), feeds_reduce is set when a REDUCE reads dst next (keep the copy in cache). */
    int consumer;
    uint8_t feeds_reduce;
    /* UCX (comm/host/ucx.c): the request while posted and the status it completed with */
    void *req;
    ucs_status_t ucs;
    /* Shared memory (comm/host/shm.c). SEND: the descriptor sent instead of the data, the
     * receiver's ack, and the two requests (descriptor send, ack recv) still to complete. RECV:
     * when a descriptor arrives for a receive with a consumer, the reduction reads the peer's
     * mapped bytes (src) instead of a copy, and the ack waits until it ran (mt_shm_release). */
    struct {
        mt_shm_ref desc;
        void *ack_req;
        uint8_t ack_byte;
        uint8_t parts;
        ucs_status_t status;
        const void *src;
    } shm;
} mt_task;

/* coll_build.c: builds the task list of a work item (progress thread, when it starts). */
mt_status mt_schedule_build(struct mt_work *work);
/* coll_build.c: releases a group's scratch. */
void mt_group_free_scratch(mt_group *group);

/* coll_schedule.c: writing the task list. Each call returns the task's index, or -1 once out of
 * memory (mt_sched_finish reports it). */
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
/* Runs once its group size - 1 RECVs (first_recv + i * recv_stride, the i-th from group rank
 * r - 1 - i) are done; reads each where it lies, the peer's shared memory included. */
int mt_sched_reduce_peers(mt_sched *s, void *dst, const void *own, size_t count, int first_recv,
                          int recv_stride);
int mt_sched_copy(mt_sched *s, void *dst, const void *src, size_t bytes, bool after_all);
/* The reduction `task` writes the work's output from element out_at on (a multiple of
 * MT_SQ_CHUNK): it also takes that part's sums of squares (the work's squares, if asked). */
void mt_sched_squares(mt_sched *s, int task, size_t out_at);
/* The work's sums of squares (if asked) from its output, once every earlier task is done. */
int mt_sched_squares_pass(mt_sched *s);
mt_status mt_sched_finish(mt_sched *s);

/* coll_schedule.c: posts/executes whatever tasks are ready (progress thread); returns true when
 * anything changed. */
bool mt_schedule_advance(struct mt_work *work);

#endif
