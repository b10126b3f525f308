/* Internal: the NCCL communicator object shared by comm/nccl/nccl_comm.c (creation, destruction)
 * and comm/nccl/nccl_coll.c (the NCCL backend: collectives, waiting). NCCL builds only. */
#ifndef MT_COMM_NCCL_INTERNAL_H
#define MT_COMM_NCCL_INTERNAL_H

#include "comm/nccl/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdbool.h>

#define MT_NCCL_MSG_CAP 512

struct mt_nccl_comm {
    mt_runtime *rt;
    mt_device *dev;
    mt_group *group;         /* the group it carries GPU collectives for */
    ncclComm_t comm;         /* NULL once aborted */
    cudaStream_t stream;     /* communication stream, known to the caching allocator */
    bool stream_tracked;
    cudaEvent_t ready;       /* recorded on the default stream before each operation */
    size_t charged;          /* GPU bytes NCCL took, charged to comm */
    char name[64];
    bool broken;             /* aborted after an error or a timeout: msg says why */
    int live_ops;            /* work handles not yet freed that point at it */
    bool orphaned;           /* destroyed while live_ops > 0: the last release frees it */
    char msg[MT_NCCL_MSG_CAP];
};

/* Waits until a non-blocking NCCL call on c has left ncclInProgress, polling the asynchronous
 * error with a deadline of timeout_s; what names the call for messages. */
mt_status mt_nccl_wait_ready(mt_nccl_comm *c, const char *what, double timeout_s);

/* Aborts the communicator after an error or timeout: keeps msg for every later call, marks the
 * group failed (its host operations fail too, as after a host transport failure) and returns
 * status with msg. */
mt_status mt_nccl_break(mt_nccl_comm *c, mt_status status, const char *msg);

#endif
