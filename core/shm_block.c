#include "core/shm_block.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

void *mt_shm_block_alloc(size_t bytes, int *fd, size_t *mapped) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t size;
    if (__builtin_add_overflow(bytes, page - 1, &size)) {
        errno = ENOMEM;
        return NULL;
    }
    size &= ~(page - 1);
    int f = memfd_create("meshtrain-cpu-block", MFD_CLOEXEC);
    if (f < 0) return NULL;
    if (ftruncate(f, (off_t)size) != 0) {
        int saved = errno;
        close(f);
        errno = saved;
        return NULL;
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    if (base == MAP_FAILED) {
        int saved = errno;
        close(f);
        errno = saved;
        return NULL;
    }
    /* Advice only: shared-memory huge pages depend on the kernel's shmem_enabled setting. */
    (void)madvise(base, size, MADV_HUGEPAGE);
    *fd = f;
    *mapped = size;
    return base;
}

void mt_shm_block_free(void *base, size_t mapped, int fd) {
    if (base) munmap(base, mapped);
    if (fd >= 0) close(fd);
}
