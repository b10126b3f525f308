/* Internal: which GPU each local rank uses, chosen from the topology so that each tp group gets
 * the strongest links among its members, and the same on every host (so that the ranks with one
 * local index, an FSDP group, stay on one NIC rail). */
#ifndef MT_MESH_MESH_PLACEMENT_H
#define MT_MESH_MESH_PLACEMENT_H

#include "topo/topology.h"

#include <meshtrain/runtime.h>
#include <meshtrain/status.h>

#include <stddef.h>

/* Computes gpu_of_local[l] (a GPU index of t) for local ranks l = 0..local_world-1, for tp groups
 * of tp consecutive local ranks. device_map (MT_DEVICE_MAP, may be NULL or "") overrides the
 * choice: a comma-separated GPU index per local rank. Without GPUs every entry is -1. why gets a
 * sentence on how the mapping was chosen (for the log). */
mt_status mt_placement_compute(const mt_topo *t, int local_world, int tp, const char *device_map,
                               int *gpu_of_local, char *why, size_t why_size);

/* The GPU of this rank for a mesh whose tp dimension has size tp: from MT_TOPO_FILE or the live
 * topology when the rank's device is a GPU or MT_TOPO_FILE is set, else -1. Rank 0 logs the
 * mapping of its host at info level. */
mt_status mt_mesh_place(mt_runtime *rt, int tp, int *gpu);

#endif
