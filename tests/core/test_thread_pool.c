/* The per-rank thread pool (core/thread_pool.c): a parallel-for runs every index exactly once on
 * 1, 2, 3 and 7 threads; its chunks are [c*grain, min(n, (c+1)*grain)) whatever the thread
 * count, so a chunk-ordered float reduction gives the same bits on any pool; two threads sharing
 * a pool both get their loops done; the sizing from MT_NUM_THREADS, MT_CPU_SHARERS and
 * LOCAL_WORLD_SIZE, and the refusal of bad values. */
#include "check.h"
#include "numeric.h"

#include "core/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct cover {
    atomic_int *hits;
    size_t *chunk_begin, *chunk_end;
    atomic_int chunk_calls;
} cover;

static void cover_chunk(void *ctx, size_t chunk, size_t begin, size_t end) {
    cover *c = ctx;
    for (size_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
    c->chunk_begin[chunk] = begin;
    c->chunk_end[chunk] = end;
    atomic_fetch_add(&c->chunk_calls, 1);
}

static void test_cover(void) {
    const int threads[] = {1, 2, 3, 7};
    const size_t sizes[] = {0, 1, 6, 7, 8, 1023, 1024, 1025, 100003};
    const size_t grains[] = {1, 7, 1024};
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
        mt_thread_pool *pool = NULL;
        CHECK_OK(mt_thread_pool_create(threads[t], &pool));
        CHECK(mt_thread_pool_threads(pool) == threads[t]);
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (size_t g = 0; g < sizeof grains / sizeof *grains; g++) {
                size_t n = sizes[s], grain = grains[g];
                size_t chunks = mt_parallel_chunks(n, grain);
                CHECK(chunks == (n + grain - 1) / grain);
                cover c = {calloc(n + 1, sizeof(atomic_int)), calloc(chunks + 1, sizeof(size_t)),
                           calloc(chunks + 1, sizeof(size_t)), 0};
                if (!c.hits || !c.chunk_begin || !c.chunk_end) abort();
                CHECK_OK(mt_parallel_for(pool, n, grain, cover_chunk, &c));
                size_t wrong = 0;
                for (size_t i = 0; i < n; i++) wrong += atomic_load(&c.hits[i]) != 1;
                CHECK_MSG(wrong == 0, "%d threads, n %zu, grain %zu: %zu indices not run once",
                          threads[t], n, grain, wrong);
                CHECK((size_t)atomic_load(&c.chunk_calls) == chunks);
                /* The boundaries are a function of n and the grain alone. */
                size_t bad = 0;
                for (size_t k = 0; k < chunks; k++) {
                    size_t b = k * grain, e = b + grain < n ? b + grain : n;
                    bad += c.chunk_begin[k] != b || c.chunk_end[k] != e;
                }
                CHECK_MSG(bad == 0, "%d threads, n %zu, grain %zu: %zu chunks moved", threads[t],
                          n, grain, bad);
                free(c.hits);
                free(c.chunk_begin);
                free(c.chunk_end);
            }
        mt_thread_pool_destroy(pool);
    }
}

/* A float sum in one partial per chunk, combined in chunk order: the pattern reductions built on
 * the pool follow, which must give the same bits on any thread count. */
typedef struct sum_job {
    const float *x;
    float *partial;
} sum_job;

static void sum_chunk(void *ctx, size_t chunk, size_t begin, size_t end) {
    sum_job *j = ctx;
    float s = 0.0f;
    for (size_t i = begin; i < end; i++) s += j->x[i];
    j->partial[chunk] = s;
}

static float pool_sum(int threads, const float *x, size_t n, size_t grain) {
    mt_thread_pool *pool = NULL;
    CHECK_OK(mt_thread_pool_create(threads, &pool));
    size_t chunks = mt_parallel_chunks(n, grain);
    sum_job j = {x, calloc(chunks + 1, sizeof(float))};
    if (!j.partial) abort();
    CHECK_OK(mt_parallel_for(pool, n, grain, sum_chunk, &j));
    float total = 0.0f;
    for (size_t c = 0; c < chunks; c++) total += j.partial[c];
    free(j.partial);
    mt_thread_pool_destroy(pool);
    return total;
}

static void test_stable_reduction(void) {
    uint64_t rng = 0x7001;
    size_t n = 1000003;
    float *x = test_lcg_floats(&rng, n, 1000.0);
    float one = pool_sum(1, x, n, 4096);
    CHECK(pool_sum(2, x, n, 4096) == one);
    CHECK(pool_sum(3, x, n, 4096) == one);
    CHECK(pool_sum(7, x, n, 4096) == one);
    /* The check can fail: another grain is another order of sums, other bits. */
    float other = pool_sum(1, x, n, 4093);
    printf("sum with grain 4096: %.9g, with grain 4093: %.9g\n", (double)one, (double)other);
    CHECK(other != one);
    free(x);
}

/* Two user threads on one pool: the second runs its chunks alone while the first holds it. */
typedef struct racer {
    mt_thread_pool *pool;
    size_t n;
    int wrong;
} racer;

static void *race(void *arg) {
    racer *r = arg;
    for (int round = 0; round < 50; round++) {
        cover c = {calloc(r->n, sizeof(atomic_int)), calloc(r->n, sizeof(size_t)),
                   calloc(r->n, sizeof(size_t)), 0};
        if (!c.hits || !c.chunk_begin || !c.chunk_end) abort();
        if (mt_parallel_for(r->pool, r->n, 64, cover_chunk, &c) != MT_OK) r->wrong++;
        for (size_t i = 0; i < r->n; i++) r->wrong += atomic_load(&c.hits[i]) != 1;
        free(c.hits);
        free(c.chunk_begin);
        free(c.chunk_end);
    }
    return NULL;
}

static void test_shared_pool(void) {
    mt_thread_pool *pool = NULL;
    CHECK_OK(mt_thread_pool_create(3, &pool));
    racer a = {pool, 20000, 0}, b = {pool, 30011, 0};
    pthread_t ta, tb;
    CHECK(pthread_create(&ta, NULL, race, &a) == 0);
    CHECK(pthread_create(&tb, NULL, race, &b) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(a.wrong == 0 && b.wrong == 0);
    mt_thread_pool_destroy(pool);
}

static int affinity_cores(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
    return CPU_COUNT(&set);
}

static int default_threads(void) {
    int t = -1;
    CHECK_OK(mt_thread_pool_default_threads(&t));
    return t;
}

static void test_sizing(void) {
    int cores = affinity_cores();
    CHECK(cores >= 1);
    unsetenv("MT_NUM_THREADS");
    unsetenv("MT_CPU_SHARERS");
    unsetenv("LOCAL_WORLD_SIZE");
    CHECK(default_threads() == cores);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    CHECK(default_threads() == (cores / 4 > 0 ? cores / 4 : 1));
    setenv("MT_CPU_SHARERS", "1", 1); /* the launcher gave this rank its own cores */
    CHECK(default_threads() == cores);
    setenv("MT_NUM_THREADS", "5", 1);
    CHECK(default_threads() == 5);
    const char *bad[] = {"0", "-1", "abc", "3x", "", "1025", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("MT_NUM_THREADS", bad[i], 1);
        int t = -7;
        mt_status st = mt_thread_pool_default_threads(&t);
        if (!*bad[i]) { /* empty is unset */
            CHECK(st == MT_OK && t == cores);
            continue;
        }
        CHECK_MSG(st == MT_ERR_INVALID_ARG, "MT_NUM_THREADS='%s' accepted", bad[i]);
        CHECK(strstr(mt_last_error(), "MT_NUM_THREADS") != NULL);
    }
    unsetenv("MT_NUM_THREADS");
    setenv("MT_CPU_SHARERS", "two", 1);
    int t = 0;
    CHECK(mt_thread_pool_default_threads(&t) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "MT_CPU_SHARERS=two") != NULL);
    unsetenv("MT_CPU_SHARERS");
    unsetenv("LOCAL_WORLD_SIZE");
    mt_thread_pool *pool = NULL;
    CHECK(mt_thread_pool_create(0, &pool) == MT_ERR_INVALID_ARG && !pool);
    CHECK(mt_thread_pool_create(MT_THREAD_POOL_MAX + 1, &pool) == MT_ERR_INVALID_ARG);
    CHECK_OK(mt_thread_pool_create(2, &pool));
    CHECK(mt_parallel_for(pool, 10, 0, sum_chunk, NULL) == MT_ERR_INVALID_ARG);
    CHECK(mt_parallel_for(NULL, 10, 1, sum_chunk, NULL) == MT_ERR_INVALID_ARG);
    mt_thread_pool_destroy(pool);
    /* The process's pool takes the sizing, once. */
    setenv("MT_NUM_THREADS", "3", 1);
    mt_thread_pool *global = NULL, *again = NULL;
    CHECK_OK(mt_thread_pool_get(&global));
    CHECK(global && mt_thread_pool_threads(global) == 3);
    CHECK_OK(mt_thread_pool_get(&again));
    CHECK(again == global);
}

int main(void) {
    test_cover();
    test_stable_reduction();
    test_shared_pool();
    test_sizing();
    return check_report("test_thread_pool");
}
