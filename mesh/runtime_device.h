/* Internal: moving a rank to the GPU the mesh's placement chose. mt_init opens GPU <local rank>
 * before any mesh exists; the mesh then knows which GPU gives the tp groups their best links. */
#ifndef MT_MESH_RUNTIME_DEVICE_H
#define MT_MESH_RUNTIME_DEVICE_H

#include <meshtrain/runtime.h>
#include <meshtrain/status.h>

/* Reopens the rank's CUDA device as GPU index. Nothing happens on a CPU device or when the index
 * is already the one in use. Refused (MT_ERR_INVALID_ARG) while the device holds allocations:
 * they would be lost. */
mt_status mt_runtime_use_gpu(mt_runtime *rt, int index);

#endif
