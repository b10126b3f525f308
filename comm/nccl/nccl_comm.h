/* Internal: an NCCL communicator for one mesh-dimension group, created eagerly when the mesh is
 * (so that the first training step does not stall on it), with its own CUDA stream, and the
 * collectives that run on it (comm/nccl/nccl_coll.c: the NCCL backend of comm/backend.h). Only
 * built with NCCL; on a CPU device nothing is created.
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
#ifndef MT_COMM_NCCL_COMM_H
#define MT_COMM_NCCL_COMM_H

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

/* Whether the NCCL backend carries a collective with buffers a and b (either may be NULL; asked by
 * mt_comm_select_backend only): *use_nccl is set when they are GPU memory and the group has a
 * communicator. GPU buffers on a group without one, or host and GPU buffers mixed, are an error
 * naming op and the group. Only a rank whose device is a GPU looks at the pointers (the CUDA
 * runtime is not touched otherwise). comm/nccl/nccl_route.c. */
mt_status mt_nccl_route(struct mt_group *group, const char *op, const void *a, const void *b,
                        bool *use_nccl);

#endif
