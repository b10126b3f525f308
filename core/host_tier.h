/* Internal: the host memory tier's state inside a device (include/meshtrain/host_memory.h).
 *
 * Its own lock and its own table: host blocks are few (shards and optimizer state per unit, not
 * per tensor), so a growing array searched linearly is enough, and keeping it apart from the
 * device's table means a host allocation never waits on the device's accounting. */
#ifndef MT_CORE_HOST_TIER_H
#define MT_CORE_HOST_TIER_H

#include <meshtrain/memory.h>
#include <meshtrain/status.h>

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct mt_host_block {
    void *ptr;
    size_t bytes; /* as asked (what is charged) */
    mt_mem_category category;
    bool locked; /* mlock'ed: munlock before free */
} mt_host_block;

typedef struct mt_host_tier {
    pthread_mutex_t lock;
    mt_mem_stats stats;
    mt_host_block *blocks;
    size_t count, cap;
    size_t reserved;      /* slots promised to allocations in flight: count + reserved <= cap */
    bool mlock;           /* MT_HOST_MLOCK=1 (CPU device only: CUDA blocks are pinned anyway) */
    size_t locked_bytes;  /* bytes this tier holds mlock'ed, for the refusal's message */
} mt_host_tier;

struct mt_device;

/* Reads MT_HOST_MEMORY and MT_HOST_MLOCK; an unparsable value is an error naming it. */
mt_status mt_host_tier_init(mt_host_tier *tier);
/* Reports blocks still allocated (warn level), frees them, and releases the tier. */
void mt_host_tier_close(struct mt_device *dev);
void mt_host_tier_reset_peaks(mt_host_tier *tier);
/* Appends the tier's lines to a memory report (nothing when it never held memory and has no
 * capacity). Returns the new length. */
size_t mt_host_tier_report(const mt_host_tier *tier, char *buf, size_t size, size_t len);

#endif
