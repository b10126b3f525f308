/* Internal: copies of large buffers that are not read again soon (a gathered output, a received
 * message), with non-temporal stores where the CPU has them: they skip the read-for-ownership of
 * every destination line and leave the caches to the data that is used next. glibc switches to
 * such stores only above a threshold derived from the cache size, which a VM may report as
 * hundreds of MiB (docs/benchmarks.md: all_gather 3.8 -> about 6 GB/s at 64 MiB). */
#ifndef MT_CORE_COPY_STREAM_H
#define MT_CORE_COPY_STREAM_H

#include <stddef.h>

/* dst and src must not overlap. Small copies use memcpy. */
void mt_copy_stream(void *dst, const void *src, size_t bytes);

#endif
