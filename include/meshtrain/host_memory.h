/* The host memory tier: host memory a rank keeps beside its device (offloaded shards, f32 master
 * weights, gradients and optimizer state), charged to the same categories as the device's memory
 * but accounted separately, against its own optional capacity.
 *
 * Blocks are page-locked on a CUDA device (cudaMallocHost), so that copies to and from the GPU run
 * at full speed and asynchronously. On the CPU device they are ordinary host memory outside the
 * device's capacity (MT_CPU_DEVICE_MEMORY), so that offloading frees device memory there too;
 * MT_HOST_MLOCK=1 locks them (mlock) like pinned memory, within RLIMIT_MEMLOCK.
 *
 * The capacity comes from MT_HOST_MEMORY ("64GiB"; unset or empty: unlimited), read when the
 * device is opened. Every block is released by mt_device_close (a leak is reported at warn level).
 */
#ifndef MESHTRAIN_HOST_MEMORY_H
#define MESHTRAIN_HOST_MEMORY_H

#include <meshtrain/api.h>
#include <meshtrain/device.h>
#include <meshtrain/memory.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Allocates bytes of host memory for dev charged to category. Zero bytes gives a valid unique
 * pointer; blocks are aligned to 4096 bytes (2 MiB from 2 MiB on the CPU device). Exceeding the
 * capacity is MT_ERR_OUT_OF_MEMORY with a message containing "out of host memory", the category,
 * the size asked and what is left; an mlock the limit refuses names RLIMIT_MEMLOCK, its value and
 * how to raise it. */
MT_API mt_status mt_host_tier_alloc(mt_device *dev, size_t bytes, mt_mem_category category,
                                    void **out);

/* Frees a block of mt_host_tier_alloc for the same device (NULL is ignored). */
MT_API void mt_host_tier_free(mt_device *dev, void *ptr);

/* True when ptr points into a live block of dev's host tier (bytes from ptr on must be inside the
 * block too). */
MT_API bool mt_host_tier_contains(mt_device *dev, const void *ptr, size_t bytes);

/* Current and peak bytes per category of the host tier, and its capacity (0 = unlimited).
 * mt_device_reset_peaks resets these peaks as well; mt_memory_report lists them after the
 * device's once the tier has held memory or has a capacity. */
MT_API void mt_host_mem_stats(const mt_device *dev, mt_mem_stats *out);

#ifdef __cplusplus
}
#endif
#endif
