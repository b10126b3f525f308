/* Internal: an NCCL communicator for one mesh-dimension group, created eagerly when the mesh is
 * (so that the first training step does not stall on it), with its own CUDA stream. Only built
 * with NCCL; on a CPU device nothing is created. */
#ifndef MT_MESH_NCCL_COMM_H
#define MT_MESH_NCCL_COMM_H

#include <meshtrain/comm.h>
#include <meshtrain/runtime.h>
#include <meshtrain/status.h>

typedef struct mt_nccl_comm mt_nccl_comm;

/* Creates the communicator of group (collective over its members) when the runtime's device is
 * a CUDA GPU and the build has NCCL; *out stays NULL otherwise. The GPU memory NCCL takes
 * (cudaMemGetInfo around the creation) is charged to the device's comm category. Errors name
 * the group and NCCL's reason. */
mt_status mt_nccl_comm_create(mt_runtime *rt, mt_group *group, mt_nccl_comm **out);

/* Destroys the communicator and releases its charge; NULL is ignored. */
void mt_nccl_comm_destroy(mt_nccl_comm *comm);

#endif
