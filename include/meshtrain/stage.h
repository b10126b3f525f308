/* Staging copies between a device's memory and its host memory tier (host_memory.h), for
 * offloaded shards: asynchronous, so that the host-to-device copy of the next unit's shard runs
 * while this unit computes and a reduced gradient shard goes to the host behind its
 * reduce-scatter.
 *
 * The data path is UCX: a ucp context and worker of the stager's own (RMA only, apart from the
 * transport's collectives), memory registered with ucp_mem_map, and each copy a ucp_get_nbx from
 * the source region (through its rkey) into the destination region, on an endpoint to the worker
 * itself; a staging thread posts and progresses them, so the caller's thread is free while the
 * bytes move. On a CUDA device the regions are CUDA memory, which needs a UCX with CUDA
 * transports (cuda_copy); with a UCX without them (Debian's 1.13) the stager copies with
 * cudaMemcpyAsync on a stream of its own instead and says so once (mt_stager_path tells which).
 *
 * Every byte a copy touches must lie in one registered region on each side: register the
 * host-tier blocks and the device buffers once (registration pins memory and costs far more than
 * a copy), unregister before freeing them. A stager is used from one thread at a time per handle;
 * copies may be started from several threads.
 */
#ifndef MESHTRAIN_STAGE_H
#define MESHTRAIN_STAGE_H

#include <meshtrain/api.h>
#include <meshtrain/device.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_stager mt_stager;
typedef struct mt_stage_copy mt_stage_copy;

typedef enum mt_stage_path {
    MT_STAGE_PATH_UCX = 0,        /* ucp_get_nbx between ucp_mem_map'ed regions */
    MT_STAGE_PATH_DEVICE_COPY = 1 /* the device's asynchronous copy (cudaMemcpyAsync) */
} mt_stage_path;

/* What a stager did over its life (mt_stager_get_stats). */
typedef struct mt_stager_stats {
    size_t copies;            /* started by mt_stage_copy_async */
    size_t waits;             /* mt_stage_wait calls that found their copy still running */
    size_t handles_allocated; /* handles malloc'd: the rest were reused from the stager's pool */
    size_t handles_pooled;    /* free handles kept for reuse now */
    size_t pool_limit;        /* the most free handles it keeps */
} mt_stager_stats;

/* Creates a stager for dev: the UCX context, worker, self endpoint and staging thread. */
MT_API mt_status mt_stager_create(mt_device *dev, mt_stager **out);

/* Waits for the copies in flight, then releases everything (regions still registered too).
 * Every handle from mt_stage_copy_async must have been given to mt_stage_wait first: a handle
 * points into its stager. With handles outstanding, destroy logs an error naming their count and
 * leaves the stager in place (leaked), so that they can still be waited for. */
MT_API void mt_stager_destroy(mt_stager *stager);

MT_API mt_stage_path mt_stager_path(const mt_stager *stager);
/* "ucx" or "device-copy". */
MT_API const char *mt_stage_path_name(mt_stage_path path);

/* The stager's counters (zeros for NULL). Handles of waited copies go back to a bounded pool of
 * the stager and are reused by the next copies, so a steady stream of copies allocates none. */
MT_API void mt_stager_get_stats(mt_stager *stager, mt_stager_stats *out);

/* Registers bytes at ptr: a host-tier block of the stager's device (host memory) or device
 * memory. Regions must not overlap. A failed ucp_mem_map is an error naming the call, the size
 * and what to do. */
MT_API mt_status mt_stager_register(mt_stager *stager, void *ptr, size_t bytes);

/* Unregisters the region that starts at ptr. Refused (MT_ERR_INVALID_ARG, nothing changed)
 * while a copy into or out of it is in flight, or when ptr starts no region. */
MT_API mt_status mt_stager_unregister(mt_stager *stager, void *ptr);

/* Starts copying bytes from src to dst; kind is MT_COPY_HOST_TO_DEVICE (src in the host tier)
 * or MT_COPY_DEVICE_TO_HOST. Both ranges must lie in registered regions. *out receives a handle
 * that mt_stage_wait must be given exactly once. Zero bytes gives a handle already done. */
MT_API mt_status mt_stage_copy_async(mt_stager *stager, void *dst, const void *src, size_t bytes,
                                     mt_copy_kind kind, mt_stage_copy **out);

/* Sets *done when the copy has finished (the bytes are in dst), without waiting; the copy's
 * failure, if any, is returned once done. The handle stays valid. */
MT_API mt_status mt_stage_test(mt_stage_copy *copy, bool *done);

/* Waits until the copy has finished, releases the handle and returns the copy's status. */
MT_API mt_status mt_stage_wait(mt_stage_copy *copy);

#ifdef __cplusplus
}
#endif
#endif
