/* Internal: host memory for large buffers (CPU device blocks, communication scratch).
 *
 * Blocks of 2 MiB and more are aligned to 2 MiB and advised to use transparent huge pages: UCX's
 * cross-process copies (cma) pin every page they touch, and with 4 KiB pages that pinning costs
 * about a fifth of the bandwidth (docs/benchmarks.md). Smaller blocks get `align`. Free with
 * free(). Returns NULL with errno set when the host refuses, or when the size overflows. */
#ifndef MT_CORE_HOST_ALLOC_H
#define MT_CORE_HOST_ALLOC_H

#include <stddef.h>

void *mt_host_alloc(size_t bytes, size_t align);

#endif
