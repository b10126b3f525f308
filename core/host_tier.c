/* The host memory tier (include/meshtrain/host_memory.h, core/host_tier.h). */
#include "core/host_tier.h"

#include "core/device_internal.h"
#include "core/env.h"
#include "core/error.h"
#include "core/host_alloc.h"

#include <meshtrain/host_memory.h>
#include <meshtrain/log.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Host blocks are copied to and from the device by DMA (pinned) or by UCX, which both work in
 * pages: page alignment keeps a block from sharing a page with anything else. */
#define HOST_BLOCK_ALIGN 4096

mt_status mt_host_tier_init(mt_host_tier *tier) {
    memset(tier, 0, sizeof *tier);
    mt_status st = mt_env_bytes("MT_HOST_MEMORY", 0, SIZE_MAX, 0,
                                "the host memory tier's capacity", &tier->stats.capacity);
    if (st != MT_OK) return mt_error_wrap(st, "cannot open the device");
    const char *lock = getenv("MT_HOST_MLOCK");
    if (lock && *lock && strcmp(lock, "0") != 0) {
        if (strcmp(lock, "1") != 0)
            return mt_error(MT_ERR_INVALID_ARG, "cannot open the device: MT_HOST_MLOCK=\"%s\" "
                            "must be 0 or 1", lock);
        tier->mlock = true;
    }
    int rc = pthread_mutex_init(&tier->lock, NULL);
    if (rc) return mt_error_errno(MT_ERR_SYSTEM, rc, "cannot create the host tier's lock");
    return MT_OK;
}

/* The system calls themselves: AddressSanitizer replaces mlock and munlock with no-ops, which
 * would make a sanitizer build lock nothing and never see the limit. */
static int lock_pages(void *ptr, size_t bytes) { return (int)syscall(SYS_mlock, ptr, bytes); }
static void unlock_pages(void *ptr, size_t bytes) { (void)syscall(SYS_munlock, ptr, bytes); }

/* mlock refused: almost always RLIMIT_MEMLOCK (8 MiB by default on Debian), which the user can
 * raise; say which limit, its value, what was asked and how. */
static mt_status mlock_refused(const mt_host_tier *tier, int err, size_t bytes,
                               mt_mem_category category) {
    struct rlimit lim;
    char limit[32] = "unknown", asked[32], held[32];
    if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
        if (lim.rlim_cur == RLIM_INFINITY) snprintf(limit, sizeof limit, "unlimited");
        else mt_format_bytes((size_t)lim.rlim_cur, limit, sizeof limit);
    }
    return mt_error_errno(MT_ERR_OUT_OF_MEMORY, err,
                          "cannot lock %s of host memory for %s (MT_HOST_MLOCK=1): mlock refused "
                          "it; the locked-memory limit RLIMIT_MEMLOCK is %s and this device's "
                          "host tier already holds %s locked. Raise the limit (`ulimit -l "
                          "unlimited` in the shell that starts training, `prlimit "
                          "--memlock=unlimited --pid <pid>`, or memlock in "
                          "/etc/security/limits.conf) or unset MT_HOST_MLOCK",
                          mt_format_bytes(bytes, asked, sizeof asked),
                          mt_mem_category_name(category), limit,
                          mt_format_bytes(tier->locked_bytes, held, sizeof held));
}

/* The block itself: pinned through the backend on a GPU, ordinary (optionally locked) host memory
 * otherwise. MT_TEST_HOST_ALLOC_FAIL=1 makes it fail as the host or CUDA would, for tests. */
static mt_status allocate_block(mt_device *dev, size_t bytes, mt_mem_category category,
                                mt_host_block *block) {
    mt_host_tier *tier = &dev->host;
    const char *fail = getenv("MT_TEST_HOST_ALLOC_FAIL");
    bool inject = fail && strcmp(fail, "1") == 0;
    char asked[32];
    mt_format_bytes(bytes, asked, sizeof asked);
    if (dev->ops->staging_alloc) {
        mt_status st = inject ? mt_error(MT_ERR_OUT_OF_MEMORY, "cudaMallocHost: out of memory "
                                         "(injected by MT_TEST_HOST_ALLOC_FAIL=1)")
                              : dev->ops->staging_alloc(bytes ? bytes : 1, &block->ptr);
        if (st != MT_OK)
            return mt_error_wrap(st, "cannot allocate %s of page-locked host memory for %s on "
                                 "%s (the host tier); pinned memory is limited by the host's "
                                 "RAM and the driver: lower MT_HOST_MEMORY or offload less",
                                 asked, mt_mem_category_name(category), dev->name);
        return MT_OK;
    }
    block->ptr = inject ? NULL : mt_host_alloc(bytes ? bytes : 1, HOST_BLOCK_ALIGN);
    if (!block->ptr)
        return mt_error_errno(MT_ERR_OUT_OF_MEMORY, inject ? ENOMEM : errno,
                              "cannot allocate %s of host memory for %s beside %s (the host "
                              "tier)%s", asked, mt_mem_category_name(category), dev->name,
                              inject ? " (injected by MT_TEST_HOST_ALLOC_FAIL=1)" : "");
    if (tier->mlock) {
        if (lock_pages(block->ptr, bytes ? bytes : 1) != 0) {
            int err = errno;
            free(block->ptr);
            block->ptr = NULL;
            pthread_mutex_lock(&tier->lock);
            mt_status st = mlock_refused(tier, err, bytes, category);
            pthread_mutex_unlock(&tier->lock);
            return st;
        }
        block->locked = true;
    }
    return MT_OK;
}

static void release_block(mt_device *dev, const mt_host_block *block) {
    if (dev->ops->staging_free) {
        dev->ops->staging_free(block->ptr);
        return;
    }
    if (block->locked) unlock_pages(block->ptr, block->bytes ? block->bytes : 1);
    free(block->ptr);
}

mt_status mt_host_tier_alloc(mt_device *dev, size_t bytes, mt_mem_category category,
                             void **out) {
    if (!dev || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_host_tier_alloc: dev and out must not be NULL");
    *out = NULL;
    if ((unsigned)category >= MT_MEM_CATEGORY_COUNT)
        return mt_error(MT_ERR_INVALID_ARG, "mt_host_tier_alloc for %s: unknown memory category "
                        "%d", dev->name, (int)category);
    mt_host_tier *tier = &dev->host;
    char why[768];
    pthread_mutex_lock(&tier->lock);
    mt_mem_stats *s = &tier->stats;
    if (!mt_mem_reserve(s, category, bytes, "MT_HOST_MEMORY; ", why, sizeof why)) {
        pthread_mutex_unlock(&tier->lock);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "out of host memory beside %s: %s", dev->name,
                        why);
    }
    /* The table slot is reserved here too (reserved counts live slots plus those promised to
     * allocations in flight): growing for count alone let two threads that both passed this
     * point append past the array once the lock was dropped. */
    if (tier->count + tier->reserved >= tier->cap) {
        size_t cap = tier->cap ? tier->cap * 2 : 16;
        mt_host_block *grown = realloc(tier->blocks, cap * sizeof *grown);
        if (!grown) {
            mt_mem_uncharge(s, category, bytes);
            pthread_mutex_unlock(&tier->lock);
            return mt_error(MT_ERR_OUT_OF_MEMORY, "cannot grow the host tier's block table beside "
                            "%s to %zu entries", dev->name, cap);
        }
        tier->blocks = grown;
        tier->cap = cap;
    }
    tier->reserved++;
    /* Charged (by mt_mem_reserve) before allocating, so that two threads cannot both pass the
     * capacity check. */
    size_t category_now = s->current[category], total_now = s->total_current;
    pthread_mutex_unlock(&tier->lock);

    mt_host_block block = {NULL, bytes, category, false};
    mt_status st = allocate_block(dev, bytes, category, &block);
    pthread_mutex_lock(&tier->lock);
    tier->reserved--;
    if (st != MT_OK) {
        mt_mem_uncharge(s, category, bytes);
    } else {
        mt_mem_commit_peaks(s, category, category_now, total_now);
        if (block.locked) tier->locked_bytes += bytes;
        tier->blocks[tier->count++] = block;
    }
    pthread_mutex_unlock(&tier->lock);
    if (st == MT_OK) *out = block.ptr;
    return st;
}

void mt_host_tier_free(mt_device *dev, void *ptr) {
    if (!ptr) return;
    if (!dev) {
        mt_log(MT_LOG_ERROR, "mt_host_tier_free(%p) without a device; ignoring it", ptr);
        return;
    }
    mt_host_tier *tier = &dev->host;
    mt_host_block block;
    bool found = false;
    pthread_mutex_lock(&tier->lock);
    for (size_t i = 0; i < tier->count; i++) {
        if (tier->blocks[i].ptr != ptr) continue;
        block = tier->blocks[i];
        tier->blocks[i] = tier->blocks[--tier->count];
        mt_mem_uncharge(&tier->stats, block.category, block.bytes);
        if (block.locked) tier->locked_bytes -= block.bytes;
        found = true;
        break;
    }
    pthread_mutex_unlock(&tier->lock);
    if (!found) {
        mt_log(MT_LOG_ERROR, "mt_host_tier_free for %s: %p is not a host tier block of this "
                             "device or was already freed; ignoring it", dev->name, ptr);
        return;
    }
    release_block(dev, &block);
}

bool mt_host_tier_contains(mt_device *dev, const void *ptr, size_t bytes) {
    if (!dev || !ptr) return false;
    uintptr_t p = (uintptr_t)ptr;
    bool inside = false;
    pthread_mutex_lock(&dev->host.lock);
    for (size_t i = 0; i < dev->host.count && !inside; i++) {
        uintptr_t b = (uintptr_t)dev->host.blocks[i].ptr;
        size_t n = dev->host.blocks[i].bytes;
        inside = p >= b && p - b <= n && bytes <= n - (p - b);
    }
    pthread_mutex_unlock(&dev->host.lock);
    return inside;
}

void mt_host_mem_stats(const mt_device *dev, mt_mem_stats *out) {
    if (!out) return;
    if (!dev) {
        memset(out, 0, sizeof *out);
        return;
    }
    /* The lock is not part of the device's observable state. */
    pthread_mutex_t *lock = (pthread_mutex_t *)&dev->host.lock;
    pthread_mutex_lock(lock);
    *out = dev->host.stats;
    pthread_mutex_unlock(lock);
}

void mt_host_tier_reset_peaks(mt_host_tier *tier) {
    pthread_mutex_lock(&tier->lock);
    mt_mem_reset_peaks(&tier->stats);
    pthread_mutex_unlock(&tier->lock);
}

size_t mt_host_tier_report(const mt_host_tier *tier, char *buf, size_t size, size_t len) {
    mt_mem_stats s;
    pthread_mutex_t *lock = (pthread_mutex_t *)&tier->lock;
    pthread_mutex_lock(lock);
    s = tier->stats;
    pthread_mutex_unlock(lock);
    if (!s.total_peak && !s.capacity) return len;
    if (len < size) len += (size_t)snprintf(buf + len, size - len, "\nhost memory tier:\n");
    return mt_mem_report_lines(&s, buf, size, len);
}

void mt_host_tier_close(mt_device *dev) {
    mt_host_tier *tier = &dev->host;
    if (tier->count) {
        char in_use[512], total[32];
        mt_mem_format_in_use(&tier->stats, in_use, sizeof in_use);
        mt_log(mt_failure_pending(NULL, NULL, 0) ? MT_LOG_INFO : MT_LOG_WARN,
               "closing %s with %zu host tier block(s) still allocated, %s in all (%s); "
               "releasing them", dev->name, tier->count,
               mt_format_bytes(tier->stats.total_current, total, sizeof total), in_use);
    }
    for (size_t i = 0; i < tier->count; i++) release_block(dev, &tier->blocks[i]);
    tier->count = 0;
}
