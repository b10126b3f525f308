/* Internal: the per-rank thread pool. One pool per process (a rank is a process) runs the host's
 * data-parallel loops (the CPU ops, the host AdamW) and the matrix products, which it splits into
 * blocks that each call OpenBLAS on one thread, so that the two never oversubscribe the rank's
 * cores.
 *
 * Determinism: a parallel-for over [0, n) is cut into fixed chunks [c*grain, min(n, (c+1)*grain))
 * whose boundaries depend on n and the grain only, never on the thread count; which thread runs
 * a chunk does not matter for elementwise work, and a reduction that keeps one partial per chunk
 * and combines the partials in chunk order gives the same bits with 1 thread or 64. */
#ifndef MT_CORE_THREAD_POOL_H
#define MT_CORE_THREAD_POOL_H

#include <meshtrain/status.h>

#include <stddef.h>

/* Upper bound on MT_NUM_THREADS and on a pool's size: a larger value is a typo, not a machine. */
#define MT_THREAD_POOL_MAX 1024

typedef struct mt_thread_pool mt_thread_pool;

/* Runs chunk [begin, end) of a parallel-for; chunk is its index (begin / grain). */
typedef void (*mt_parallel_fn)(void *ctx, size_t chunk, size_t begin, size_t end);

/* A pool of `threads` (1..MT_THREAD_POOL_MAX) threads: the caller of a parallel-for is one of
 * them, so threads - 1 workers are started. */
mt_status mt_thread_pool_create(int threads, mt_thread_pool **out);
/* Stops and joins the workers; NULL is a no-op. No parallel-for may be running. */
void mt_thread_pool_destroy(mt_thread_pool *pool);
int mt_thread_pool_threads(const mt_thread_pool *pool);

/* The number of chunks of a parallel-for over n with this grain (grain >= 1). */
size_t mt_parallel_chunks(size_t n, size_t grain);

/* Calls fn on every chunk of [0, n) exactly once and returns when all have run. grain must be
 * >= 1. Callable from any thread: while another thread's parallel-for holds the pool, the
 * caller runs its chunks alone (same chunks, same results). fn must not fail; it reports
 * through its ctx. */
mt_status mt_parallel_for(mt_thread_pool *pool, size_t n, size_t grain, mt_parallel_fn fn,
                          void *ctx);

/* The rank's thread count: MT_NUM_THREADS when set (an integer in 1..MT_THREAD_POOL_MAX, else
 * MT_ERR_INVALID_ARG); otherwise the cores of the process's affinity mask divided among the
 * local ranks that share them (MT_CPU_SHARERS when the launcher says, else LOCAL_WORLD_SIZE),
 * at least 1. docs/architecture.md, "Threading and ownership", gives the reasons. */
mt_status mt_thread_pool_default_threads(int *threads);

/* The process's pool, created on first use with mt_thread_pool_default_threads() threads;
 * creating it sets OpenBLAS to one thread (the pool's threads call it, core/cpu/ops_gemm.c).
 * It lives until the process exits, as OpenBLAS's own threads do. mt_init creates it so that a bad MT_NUM_THREADS fails there, before any
 * product runs with another BLAS thread count. */
mt_status mt_thread_pool_get(mt_thread_pool **pool);

#endif
