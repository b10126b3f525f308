/* Internal: host memory that other local processes can map (memfd), so that a peer on the same
 * host copies straight from it with memcpy instead of a cross-process copy that pins every page
 * (cma). Large CPU-device blocks are shared blocks; the UCX transport passes a block's reference
 * (pid, fd, serial, offset) to a local peer, which maps the block once and keeps it mapped.
 */
#ifndef MT_CORE_SHM_BLOCK_H
#define MT_CORE_SHM_BLOCK_H

#include <meshtrain/device.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CPU-device blocks of at least this many bytes are shared blocks (unless MT_CPU_SHARED_MEMORY=0);
 * smaller ones are private: an fd per block would be wasted on them. */
#define MT_SHM_BLOCK_MIN_BYTES ((size_t)1 << 20)

/* Where bytes of a shared block are: enough for a peer to map and read them. */
typedef struct mt_shm_ref {
    int32_t pid;         /* owning process */
    int32_t fd;          /* the memfd in the owning process */
    uint64_t serial;     /* unique per block within the owning process, never reused */
    uint64_t block_size; /* bytes mapped from the memfd */
    uint64_t offset;     /* where the bytes start inside the block */
} mt_shm_ref;

/* Maps a new shared block of at least bytes; NULL (errno set) when the host refuses. */
void *mt_shm_block_alloc(size_t bytes, int *fd, size_t *mapped);

/* Unmaps a block from mt_shm_block_alloc and closes its fd. */
void mt_shm_block_free(void *base, size_t mapped, int fd);

/* True when [ptr, ptr + bytes) lies inside one shared block of the CPU device dev; fills ref.
 * Thread-safe (the progress thread asks while user threads allocate). */
bool mt_device_shared_range(mt_device *dev, const void *ptr, size_t bytes, mt_shm_ref *ref);

#endif
