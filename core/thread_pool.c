/* The per-rank thread pool (core/thread_pool.h). Workers sleep on a condition variable between
 * jobs; a job's chunks are handed out through an atomic counter, so a slow thread delays the job
 * by at most one chunk. The chunk boundaries come from n and the grain alone. The caller waits
 * only for the workers that joined its job: on a busy machine a worker that is not scheduled in
 * time finds the job closed and sleeps on, instead of holding the caller up. */
#include "core/thread_pool.h"

#include "core/env.h"

#include "core/error.h"
#include "core/thread_name.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* One parallel-for, on its caller's stack. */
typedef struct pool_job {
    mt_parallel_fn fn;
    void *ctx;
    size_t n, grain, chunks;
    atomic_size_t next;
} pool_job;

struct mt_thread_pool {
    int threads;
    pthread_t *workers;
    int started;
    /* One job at a time: a second caller that finds it taken runs its chunks alone. */
    pthread_mutex_t busy;
    pthread_mutex_t lock;
    pthread_cond_t wake, idle;
    unsigned long generation; /* bumped per job, under lock */
    bool stop;
    pool_job *current; /* the job workers may join, NULL once its chunks are all taken */
    int inside;        /* workers inside a job, under lock */
};

size_t mt_parallel_chunks(size_t n, size_t grain) { return n / grain + (n % grain != 0); }

static void run_chunks(pool_job *j) {
    for (;;) {
        size_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (c >= j->chunks) return;
        size_t begin = c * j->grain;
        size_t end = j->n - begin < j->grain ? j->n : begin + j->grain;
        j->fn(j->ctx, c, begin, end);
    }
}

static void *worker_main(void *arg) {
    mt_name_this_thread("mt-pool");
    mt_thread_pool *p = arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->stop && (!p->current || p->generation == seen))
            pthread_cond_wait(&p->wake, &p->lock);
        if (p->stop) break;
        seen = p->generation;
        pool_job *j = p->current;
        p->inside++;
        pthread_mutex_unlock(&p->lock);
        run_chunks(j);
        pthread_mutex_lock(&p->lock);
        if (--p->inside == 0) pthread_cond_signal(&p->idle);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

void mt_thread_pool_destroy(mt_thread_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->started; i++) pthread_join(p->workers[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->idle);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->busy);
    free(p->workers);
    free(p);
}

mt_status mt_thread_pool_create(int threads, mt_thread_pool **out) {
    if (!out) return mt_error(MT_ERR_INVALID_ARG, "thread pool: out must not be NULL");
    *out = NULL;
    if (threads < 1 || threads > MT_THREAD_POOL_MAX)
        return mt_error(MT_ERR_INVALID_ARG, "thread pool: %d threads (1..%d)", threads,
                        MT_THREAD_POOL_MAX);
    mt_thread_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->workers = calloc((size_t)threads, sizeof *p->workers))) {
        free(p);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "thread pool: out of memory for %d threads",
                        threads);
    }
    p->threads = threads;
    pthread_mutex_init(&p->busy, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->idle, NULL);
    for (int i = 0; i < threads - 1; i++) {
        int e = pthread_create(&p->workers[i], NULL, worker_main, p);
        if (e != 0) {
            mt_thread_pool_destroy(p);
            return mt_error_errno(MT_ERR_SYSTEM, e, "thread pool: starting worker %d of %d", i + 1,
                                  threads - 1);
        }
        p->started++;
    }
    *out = p;
    return MT_OK;
}

int mt_thread_pool_threads(const mt_thread_pool *p) { return p ? p->threads : 0; }

mt_status mt_parallel_for(mt_thread_pool *p, size_t n, size_t grain, mt_parallel_fn fn,
                          void *ctx) {
    if (!p || !fn || grain == 0)
        return mt_error(MT_ERR_INVALID_ARG, "parallel for: %s",
                        !p ? "no pool" : !fn ? "no function" : "a grain of 0");
    size_t chunks = mt_parallel_chunks(n, grain);
    pool_job job = {.fn = fn, .ctx = ctx, .n = n, .grain = grain, .chunks = chunks};
    atomic_init(&job.next, 0);
    /* One chunk, one thread, or the pool busy with another caller's job: no hand-off, the
     * caller takes every chunk itself (the same boundaries, in order). */
    if (chunks <= 1 || p->threads == 1 || pthread_mutex_trylock(&p->busy) != 0) {
        run_chunks(&job);
        return MT_OK;
    }
    pthread_mutex_lock(&p->lock);
    p->current = &job;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    run_chunks(&job);
    /* Every chunk is taken: close the job to late workers, wait for those inside it. */
    pthread_mutex_lock(&p->lock);
    p->current = NULL;
    while (p->inside > 0) pthread_cond_wait(&p->idle, &p->lock);
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&p->busy);
    return MT_OK;
}

mt_status mt_thread_pool_default_threads(int *threads) {
    long long chosen;
    MT_TRY(mt_env_int("MT_NUM_THREADS", 1, MT_THREAD_POOL_MAX, 0,
                      "threads of the rank's pool", &chosen));
    if (chosen) {
        *threads = (int)chosen;
        return MT_OK;
    }
    enum { MAX_CPUS = 8192 };
    cpu_set_t *set = CPU_ALLOC(MAX_CPUS);
    if (!set) return mt_error(MT_ERR_OUT_OF_MEMORY, "thread pool: out of memory for a cpu set");
    size_t size = CPU_ALLOC_SIZE(MAX_CPUS);
    int e = sched_getaffinity(0, size, set) == 0 ? 0 : errno;
    long cores = e ? 0 : CPU_COUNT_S(size, set);
    CPU_FREE(set);
    if (e) return mt_error_errno(MT_ERR_SYSTEM, e, "thread pool: reading the CPU affinity");
    /* Without a launcher's word, every local rank is assumed to share this mask (an unbound
     * launch): oversubscribing costs more than an idle core. */
    long long sharers;
    MT_TRY(mt_env_int("MT_CPU_SHARERS", 1, INT_MAX, 0, "ranks sharing this rank's CPUs",
                      &sharers));
    if (!sharers)
        MT_TRY(mt_env_int("LOCAL_WORLD_SIZE", 1, INT_MAX, 0, "ranks on this node", &sharers));
    if (!sharers) sharers = 1;
    long t = (long)(cores / sharers);
    if (t < 1) t = 1;
    if (t > MT_THREAD_POOL_MAX) t = MT_THREAD_POOL_MAX;
    *threads = (int)t;
    return MT_OK;
}

static pthread_mutex_t global_lock = PTHREAD_MUTEX_INITIALIZER;
static mt_thread_pool *global_pool;

mt_status mt_thread_pool_get(mt_thread_pool **pool) {
    pthread_mutex_lock(&global_lock);
    mt_status st = MT_OK;
    if (!global_pool) {
        int threads = 1;
        st = mt_thread_pool_default_threads(&threads);
        if (st == MT_OK) st = mt_thread_pool_create(threads, &global_pool);
        /* The pool's threads call the BLAS on blocks of a product (core/cpu/ops_gemm.c):
         * OpenBLAS's own workers would only spin beside them, so OpenBLAS runs on 1 thread. */
        if (st == MT_OK) openblas_set_num_threads(1);
    }
    *pool = global_pool;
    pthread_mutex_unlock(&global_lock);
    return st == MT_OK ? MT_OK : mt_error_wrap(st, "the rank's thread pool");
}
