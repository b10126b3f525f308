#include "core/host_alloc.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_PAGE_BYTES ((size_t)2 << 20)

void *mt_host_alloc(size_t bytes, size_t align) {
    if (bytes >= HUGE_PAGE_BYTES) align = HUGE_PAGE_BYTES;
    size_t rounded;
    if (__builtin_add_overflow(bytes, align - 1, &rounded)) {
        errno = ENOMEM;
        return NULL;
    }
    rounded &= ~(align - 1);
    if (rounded == 0) rounded = align;
    void *ptr = aligned_alloc(align, rounded);
    /* Advice only: a kernel without THP, or with it disabled, keeps small pages. */
    if (ptr && align == HUGE_PAGE_BYTES) (void)madvise(ptr, rounded, MADV_HUGEPAGE);
    return ptr;
}
