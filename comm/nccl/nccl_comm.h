/* Internal: an NCCL communicator for one mesh-dimension group, created eagerly when the mesh is
 * (so that the first training step does not stall on it), with its own CUDA stream, and the
 * collectives that run on it (comm/nccl/nccl_coll.c). Only built with NCCL; on a CPU device nothing is
 * created.
 *
 * A group's collective runs on NCCL when its buffers are GPU memory and the group has a
 * communicator (the groups of a mesh on GPU ranks); host buffers always go through the host
 * transport (UCX), so a loss or a norm in host memory can still be all-reduced on the same group.
 * NCCL work is ordered after the compute queued so far on the device's default stream (an event
 * recorded there, waited for on the communicator's stream), so a prefetched all-gather or a
 * reduce-scatter runs beside the compute queued after it. Waiting polls the work's completion
 * event and NCCL's asynchronous error; after MT_TIMEOUT_S, or on an NCCL error, the communicator
 * is aborted and the error names the operation, the group and the reason; every later operation
 * on the communicator returns that error. */
#ifndef MT_MESH_NCCL_COMM_H
#define MT_MESH_NCCL_COMM_H

#include <meshtrain/comm.h>
#include <meshtrain/runtime.h>
#include <meshtrain/status.h>

#include <stdbool.h>

typedef struct mt_nccl_comm mt_nccl_comm;

/* Creates the communicator of group (collective over its members) when the runtime's device is
 * a CUDA GPU and the build has NCCL; *out stays NULL otherwise. The GPU memory NCCL takes
 * (cudaMemGetInfo around the creation) is charged to the device's comm category. Errors name
 * the group and NCCL's reason. */
mt_status mt_nccl_comm_create(mt_runtime *rt, mt_group *group, mt_nccl_comm **out);

/* Destroys the communicator (detaching it from its group) and releases its charge; NULL is
 * ignored. */
void mt_nccl_comm_destroy(mt_nccl_comm *comm);

/* Who carries a collective with buffers a and b (either may be NULL): *use_nccl is set when they
 * are GPU memory and the group has a communicator. GPU buffers on a group without one, or host
 * and GPU buffers mixed, are an error naming op and the group. Only a rank whose device is a
 * GPU looks at the pointers (the CUDA runtime is not touched otherwise). */
mt_status mt_nccl_route(struct mt_group *group, const char *op, const void *a, const void *b,
                        bool *use_nccl);

/* Queues work (kind and arguments filled in, as for the host transport; one reference, the
 * caller's) on the group's communicator. On error nothing is queued. */
mt_status mt_nccl_enqueue(struct mt_group *group, struct mt_work *work);

/* mt_work_wait, mt_work_test and mt_work_free for work queued with mt_nccl_enqueue. release
 * waits for unfinished work (MT_TIMEOUT_S) and frees the work's NCCL state, not the work. */
mt_status mt_nccl_work_wait(struct mt_work *work, double timeout_s);
mt_status mt_nccl_work_test(struct mt_work *work, bool *done);
void mt_nccl_work_release(struct mt_work *work);

#endif
