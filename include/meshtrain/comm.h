/* Collectives and point-to-point over process groups.
 *
 * Every operation is asynchronous: it queues the work and returns a handle to wait on (pass NULL
 * to wait before returning). Operations on one group run in the order they were issued; every
 * member must issue the same operations on the group in the same order. Buffers must stay valid
 * until the work completes.
 *
 * Which buffers go where: an operation whose buffers are GPU memory goes to NCCL when the group
 * has an NCCL communicator (every dimension group of a mesh on GPU ranks; see mesh.h), on the
 * communicator's own stream, ordered after the work already queued on the device's default
 * stream. Everything else goes to the host backend (UCX between processes, shared memory between
 * ranks of one host, driven by the process's communication thread): host memory, the CPU
 * device's memory, and every operation of count 0. So a loss or a norm in host memory can be
 * all-reduced on the same group as GPU gradients. These are errors that say so: GPU buffers on a
 * group without a communicator (the world group, groups from mt_group_create), a host and a GPU
 * buffer in one call, and point-to-point on GPU buffers.
 *
 * bf16: every hop accumulates in f32 and sends bf16, so a value is rounded once per hop, as NCCL
 * does. Host reductions are deterministic for a given group size and message size.
 */
#ifndef MESHTRAIN_COMM_H
#define MESHTRAIN_COMM_H

#include <meshtrain/api.h>
#include <meshtrain/dtype.h>
#include <meshtrain/runtime.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_reduce_op { MT_REDUCE_SUM = 0, MT_REDUCE_AVG, MT_REDUCE_MAX } mt_reduce_op;

typedef struct mt_work mt_work;

/* Creates a group of the given global ranks (ascending or not; a rank's group rank is its index
 * in `ranks`). Every member calls it with the same list; it is collective over the members and
 * returns MT_ERR_INVALID_ARG on a non-member. name is used in messages ("tp", "dp", ...). */
MT_API mt_status mt_group_create(mt_runtime *rt, const int *ranks, int nranks, const char *name,
                                 mt_group **out);

/* Destroys a group created with mt_group_create (not the world group). Waits for its work. */
MT_API void mt_group_destroy(mt_group *group);

MT_API int mt_group_size(const mt_group *group);
/* This process's rank within the group. */
MT_API int mt_group_rank(const mt_group *group);
/* The global rank of group member i. */
MT_API int mt_group_global_rank(const mt_group *group, int i);
MT_API const char *mt_group_name(const mt_group *group);

/* recv (count * size elements) receives every member's `count` elements of send, in group rank
 * order. In place when send == recv + rank * count. */
MT_API mt_status mt_all_gather(mt_group *group, const void *send, void *recv, size_t count,
                               mt_dtype dtype, mt_work **work);

/* send holds size * count elements; member i receives in recv the reduction over members of
 * block i (count elements). op: sum or avg. */
MT_API mt_status mt_reduce_scatter(mt_group *group, const void *send, void *recv, size_t count,
                                   mt_dtype dtype, mt_reduce_op op, mt_work **work);

/* recv receives the element-wise reduction of every member's send (count elements, any count).
 * send == recv is allowed. op: sum, avg or max. */
MT_API mt_status mt_all_reduce(mt_group *group, const void *send, void *recv, size_t count,
                               mt_dtype dtype, mt_reduce_op op, mt_work **work);

/* Every member's buf receives root's buf (root is a group rank). */
MT_API mt_status mt_broadcast(mt_group *group, void *buf, size_t count, mt_dtype dtype, int root,
                              mt_work **work);

/* Point-to-point within a group (peer is a group rank). Messages between a pair arrive in the
 * order they were sent; sizes must match. */
MT_API mt_status mt_send(mt_group *group, const void *buf, size_t count, mt_dtype dtype, int peer,
                         mt_work **work);
MT_API mt_status mt_recv(mt_group *group, void *buf, size_t count, mt_dtype dtype, int peer,
                         mt_work **work);

/* What the collectives issued on a group by this process moved: calls and payload bytes per
 * kind, since the group was created or last reset. A collective counts once it launched (a call
 * that failed before its work started counts nothing). The payload is the whole tensor the
 * collective is about: an all-gather's gathered output (size x count elements), a
 * reduce-scatter's input (size x count), an all-reduce's or a broadcast's count elements. A ring
 * sends (size - 1) / size of it per rank for an all-gather or reduce-scatter, twice that for an
 * all-reduce. For measuring what a model's parallelism costs (docs/benchmarks.md). */
typedef enum mt_coll_kind {
    MT_COLL_ALL_GATHER,
    MT_COLL_REDUCE_SCATTER,
    MT_COLL_ALL_REDUCE,
    MT_COLL_BROADCAST,
    MT_COLL_KINDS
} mt_coll_kind;

typedef struct mt_comm_counters {
    uint64_t calls[MT_COLL_KINDS];
    uint64_t bytes[MT_COLL_KINDS];
} mt_comm_counters;

/* *out = the group's counters (zeros for a NULL group). */
MT_API void mt_group_counters(const mt_group *group, mt_comm_counters *out);
MT_API void mt_group_counters_reset(mt_group *group);
/* "all_gather", "reduce_scatter", "all_reduce", "broadcast" ("?" otherwise). */
MT_API const char *mt_coll_kind_name(mt_coll_kind kind);

/* Completes when every member has entered it. */
MT_API mt_status mt_barrier(mt_group *group, mt_work **work);

/* Waits for the work (timeout_s < 0: MT_TIMEOUT_S). A timeout error names the operation, the
 * group and the peer that did not answer. The work stays valid until mt_work_free. */
MT_API mt_status mt_work_wait(mt_work *work, double timeout_s);

/* Non-blocking: *done is set when the work finished (its status is then returned). */
MT_API mt_status mt_work_test(mt_work *work, bool *done);

/* Frees a work handle; waits for the work first if it is still running. */
MT_API void mt_work_free(mt_work *work);

#ifdef __cplusplus
}
#endif
#endif
