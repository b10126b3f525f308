/* Internal: how the CPU ops use the rank's thread pool (core/thread_pool.h). Each op cuts its
 * work into fixed chunks whose size is set here from the work's shape alone, never from the
 * thread count, so that an op gives the same bits with 1 thread or 7 (docs/cpu-kernels.md). */
#ifndef MT_CORE_CPU_PARALLEL_H
#define MT_CORE_CPU_PARALLEL_H

#include "core/thread_pool.h"

#include <stddef.h>

/* Elements per chunk of elementwise work: 64 KiB of floats, enough to amortise a hand-off to a
 * worker (a few microseconds) and small enough that 2..8 threads share a 256 x 768 tensor. */
#define MT_CPU_ELEM_GRAIN ((size_t)16384)

/* Rows per chunk for row-wise work on rows of row_elems elements: about MT_CPU_ELEM_GRAIN
 * elements, at least one row. */
size_t mt_cpu_row_grain(size_t row_elems);

/* Columns per chunk for a reduction over rows kept per column (d_bias, d_gamma): a multiple of
 * the widest vector so that every chunk but the last vectorises whole. */
#define MT_CPU_COL_GRAIN ((size_t)128)

/* Runs fn over the fixed chunks of [0, n) on the rank's pool; op names the caller in errors. */
mt_status mt_cpu_parallel(const char *op, size_t n, size_t grain, mt_parallel_fn fn, void *ctx);

#endif
