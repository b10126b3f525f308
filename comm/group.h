/* Internal: the group object behind mt_group (include/meshtrain/comm.h) and its life cycle
 * (comm/group.c). A group belongs to the host transport (tr); the NCCL communicator a mesh
 * dimension adds to it (nccl) carries its collectives on GPU buffers (comm/backend.h). */
#ifndef MT_COMM_GROUP_H
#define MT_COMM_GROUP_H

#include "comm/transport.h"
#include "comm/work.h"

#include <meshtrain/comm.h>
#include <meshtrain/device.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct mt_nccl_comm;

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
    /* Collectives issued on the group by this process and their payload bytes, by mt_coll_kind
     * (comm/counters.c; user threads issue, so atomic). */
    _Atomic uint64_t coll_calls[MT_COLL_KINDS], coll_bytes[MT_COLL_KINDS];
};

/* Counts one launched collective of kind (an mt_op_kind) moving bytes of payload
 * (comm/counters.c; called by mt_work_submit_or_wait after a successful launch). */
void mt_group_count(mt_group *group, int kind, uint64_t bytes);

/* Fails with the group's first failure (or a NULL group), naming op; MT_OK if it can be used. */
mt_status mt_group_check_usable(mt_group *group, const char *op);
/* Makes the group unusable with msg (the first failure wins); takes tr->mu. */
void mt_group_mark_failed(mt_group *group, const char *msg);
/* Allocates a group of nranks global ranks on tr (its id is set by the caller). */
mt_group *mt_group_alloc(mt_transport *tr, const int *ranks, int nranks, const char *name);
void mt_group_free(mt_group *group);

#endif
