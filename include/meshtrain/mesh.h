/* DeviceMesh: the ranks of the job laid out as a named N-D array, e.g. {2, 4} / {"dp", "tp"}:
 * "tp inside each host, dp across hosts". Ranks are row-major (the last dimension varies
 * fastest), so the innermost dimension's groups are consecutive local ranks of one host.
 *
 * Each dimension has a process group (comm.h collectives work on it as on any group): the
 * ranks that share every other coordinate, ordered by their coordinate along the dimension.
 * Creating a mesh is collective over the world; every rank must pass the same shape and names
 * (checked through the rendezvous store: a disagreement is an error naming the ranks, not a
 * hang).
 *
 * Validation: the product of the shape must equal the world size; names must be non-empty and
 * unique; the "tp" dimension (or, without one, the innermost dimension of a mesh with two or
 * more dimensions) must not span hosts unless MT_ALLOW_CROSS_HOST_TP=1.
 *
 * Placement: on a host with GPUs, each local rank is given the GPU that gives its tp group the
 * strongest links (one NVLink island first, then PIX, PXB, one NUMA node), the same on every
 * host; MT_DEVICE_MAP=3,2,1,0,... overrides it. Rank 0 prints the mesh and the mapping at info
 * level (MT_LOG_LEVEL=info).
 */
#ifndef MESHTRAIN_MESH_H
#define MESHTRAIN_MESH_H

#include <meshtrain/api.h>
#include <meshtrain/comm.h>
#include <meshtrain/runtime.h>
#include <meshtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MT_MESH_MAX_DIMS 8
#define MT_MESH_NAME_MAX 32

typedef struct mt_mesh mt_mesh;

/* Creates a mesh over every rank of the job (collective over the world). shape and names have
 * ndim entries; names are at most MT_MESH_NAME_MAX - 1 characters. */
MT_API
mt_status mt_mesh_create(mt_runtime *rt, int ndim, const int *shape, const char *const *names,
                         mt_mesh **out);

/* Destroys a mesh and the groups it created. Sub-meshes must be destroyed first. */
MT_API void mt_mesh_destroy(mt_mesh *mesh);

MT_API int mt_mesh_ndim(const mt_mesh *mesh);
/* Name and size of dimension dim (0 <= dim < ndim); NULL / 0 out of range. */
MT_API const char *mt_mesh_dim_name(const mt_mesh *mesh, int dim);
MT_API int mt_mesh_dim_size(const mt_mesh *mesh, int dim);
/* The position of the dimension called name, -1 when the mesh has none. */
MT_API int mt_mesh_dim_index(const mt_mesh *mesh, const char *name);
/* This rank's coordinate along dimension dim; -1 out of range. */
MT_API int mt_mesh_coord(const mt_mesh *mesh, int dim);
/* The global rank at the given coordinates (ndim entries, within this mesh); -1 when invalid. */
MT_API int mt_mesh_rank_at(const mt_mesh *mesh, const int *coords);

/* The group of a dimension or of a flattened dimension, by name. The mesh owns it. */
MT_API mt_status mt_mesh_group(const mt_mesh *mesh, const char *name, mt_group **out);

/* Flattens the named dimensions (given in mesh order, e.g. {"dp_replicate", "dp_shard"}) into
 * one dimension called flat_name with its own group (collective over the world). The group's
 * ranks are ordered row-major over the flattened dimensions. Later mt_mesh_group(flat_name)
 * returns it; flattening again under the same name with the same dimensions returns it too. */
MT_API
mt_status mt_mesh_flatten(mt_mesh *mesh, const char *const *names, int n, const char *flat_name,
                          mt_group **out);

/* The sub-mesh of the named dimensions (in mesh order) that contains this rank: its other
 * coordinates are fixed. It shares the parent's groups; destroy it before the parent. */
MT_API mt_status mt_mesh_submesh(mt_mesh *mesh, const char *const *names, int n, mt_mesh **out);

/* The runtime the mesh was created on. */
MT_API mt_runtime *mt_mesh_runtime(const mt_mesh *mesh);

/* The GPU index the placement gives this rank (-1 when the host has no GPU or the topology is
 * unknown); the device in use is mt_runtime_device. */
MT_API int mt_mesh_gpu(const mt_mesh *mesh);

#ifdef __cplusplus
}
#endif
#endif
