/* Offload staging (include/meshtrain/stage.h) on the CPU device over UCX: copies between a
 * host-tier block and device memory in both directions for 0, 1, 4095 bytes and 16 MiB, at
 * unaligned offsets, bit-exact; 64 copies in flight at once, polled with mt_stage_test until all
 * are done; test after done stays done; ranges outside a registered region, overlapping
 * registrations, unregistering a region twice and an injected ucp_mem_map failure are errors
 * that say what to do, and nothing crashes. Eight threads registering the same block at once:
 * exactly one succeeds (the overlap used to be checked before the unlocked ucp_mem_map only).
 * Destroying a stager with a copy never waited for is refused (logged) and leaves the stager
 * usable: the copy is waited for, then destroy works. Handles come from a bounded pool per
 * stager: rounds of pool_limit copies in flight allocate no new handle after the first, more in
 * flight than the pool keeps leaves it at its limit, and a handle waited for after a refused
 * destroy goes back to the pool. A copy that fails on the staging thread (injected by
 * MT_TEST_STAGE_COPY_FAIL=1) is an error from mt_stage_test and mt_stage_wait that says so. */
#include "check.h"
#include "numeric.h"

#include "comm/host/stage.h"

#include <meshtrain/device.h>
#include <meshtrain/host_memory.h>
#include <meshtrain/stage.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BIG ((size_t)16 << 20)
#define SLACK 4096

typedef struct bufs {
    mt_device *dev;
    mt_stager *st;
    unsigned char *host, *device;
} bufs;

static void copy_both_ways(bufs *b, size_t n, size_t host_off, size_t dev_off, unsigned seed) {
    unsigned char *want = malloc(n ? n : 1);
    test_fill_bytes(want, n, seed);
    memcpy(b->host + host_off, want, n);
    memset(b->device, 0x5A, BIG + SLACK);
    mt_stage_copy *c = NULL;
    CHECK_OK(mt_stage_copy_async(b->st, b->device + dev_off, b->host + host_off, n,
                                 MT_COPY_HOST_TO_DEVICE, &c));
    CHECK_OK(mt_stage_wait(c));
    CHECK_MSG(memcmp(b->device + dev_off, want, n) == 0, "host to device, %zu bytes", n);
    /* Bytes around the destination are untouched. */
    CHECK(dev_off == 0 || b->device[dev_off - 1] == 0x5A);
    CHECK(b->device[dev_off + n] == 0x5A);

    test_fill_bytes(want, n, seed + 1);
    memcpy(b->device + dev_off, want, n);
    memset(b->host, 0xA5, BIG + SLACK);
    CHECK_OK(mt_stage_copy_async(b->st, b->host + host_off, b->device + dev_off, n,
                                 MT_COPY_DEVICE_TO_HOST, &c));
    CHECK_OK(mt_stage_wait(c));
    CHECK_MSG(memcmp(b->host + host_off, want, n) == 0, "device to host, %zu bytes", n);
    CHECK(b->host[host_off + n] == 0xA5);
    free(want);
}

static void test_many_in_flight(bufs *b) {
    enum { COPIES = 64 };
    size_t chunk = BIG / COPIES;
    test_fill_bytes(b->host, BIG, 77);
    memset(b->device, 0, BIG);
    mt_stage_copy *c[COPIES];
    for (int i = 0; i < COPIES; i++)
        CHECK_OK(mt_stage_copy_async(b->st, b->device + (size_t)i * chunk,
                                     b->host + (size_t)i * chunk, chunk, MT_COPY_HOST_TO_DEVICE,
                                     &c[i]));
    bool all = false;
    long polls = 0;
    while (!all) {
        all = true;
        for (int i = 0; i < COPIES; i++) {
            bool done = false;
            CHECK_OK(mt_stage_test(c[i], &done));
            all = all && done;
        }
        polls++;
    }
    for (int i = 0; i < COPIES; i++) {
        bool done = false;
        CHECK_OK(mt_stage_test(c[i], &done)); /* done stays done */
        CHECK(done);
        CHECK_OK(mt_stage_wait(c[i]));
    }
    CHECK(memcmp(b->device, b->host, BIG) == 0);
    printf("64 copies of %zu bytes in flight: done after %ld polling rounds\n", chunk, polls);
}

static void test_errors(bufs *b) {
    mt_stage_copy *c = (mt_stage_copy *)1;
    static unsigned char outside[64];
    CHECK(mt_stage_copy_async(b->st, b->device, outside, sizeof outside, MT_COPY_HOST_TO_DEVICE,
                              &c) == MT_ERR_INVALID_ARG);
    CHECK(c == NULL);
    CHECK_MSG(strstr(mt_last_error(), "source") && strstr(mt_last_error(), "mt_stager_register"),
              "%s", mt_last_error());
    /* Running past the end of the region is outside it too. */
    CHECK(mt_stage_copy_async(b->st, b->device + 1, b->host, BIG + SLACK, MT_COPY_HOST_TO_DEVICE,
                              &c) == MT_ERR_INVALID_ARG);
    CHECK(mt_stage_copy_async(b->st, b->device, b->host, 1, MT_COPY_DEVICE_TO_DEVICE, &c) ==
          MT_ERR_INVALID_ARG);
    CHECK(mt_stager_register(b->st, b->host + 100, 10) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "overlap"), "%s", mt_last_error());
    CHECK(mt_stager_unregister(b->st, outside) == MT_ERR_INVALID_ARG);

    setenv("MT_TEST_UCX_MEM_MAP_FAIL", "1", 1);
    mt_status s = mt_stager_register(b->st, outside, sizeof outside);
    unsetenv("MT_TEST_UCX_MEM_MAP_FAIL");
    CHECK(s == MT_ERR_COMM);
    CHECK_MSG(strstr(mt_last_error(), "ucp_mem_map") && strstr(mt_last_error(), "ulimit -l") &&
              strstr(mt_last_error(), "64 B"), "%s", mt_last_error());
    printf("refused as it should be: %s\n", mt_last_error());
    /* Nothing was registered: a copy from it is still refused, and registering it now works. */
    CHECK(mt_stage_copy_async(b->st, b->device, outside, 8, MT_COPY_HOST_TO_DEVICE, &c) ==
          MT_ERR_INVALID_ARG);
    CHECK_OK(mt_stager_register(b->st, outside, sizeof outside));
    CHECK_OK(mt_stager_unregister(b->st, outside));
}

enum { REG_THREADS = 8, REG_ROUNDS = 20 };

typedef struct reg_arg {
    mt_stager *st;
    void *ptr;
    size_t bytes;
    pthread_barrier_t *go;
    mt_status status;
} reg_arg;

static void *register_thread(void *p) {
    reg_arg *a = p;
    pthread_barrier_wait(a->go);
    a->status = mt_stager_register(a->st, a->ptr, a->bytes);
    return NULL;
}

static void test_concurrent_register(bufs *b) {
    size_t bytes = 64u << 20; /* large, so that ucp_mem_map takes a while: a wide race window */
    unsigned char *blk = NULL;
    CHECK_OK(mt_host_tier_alloc(b->dev, bytes, MT_MEM_COMM, (void **)&blk));
    if (!blk) return;
    for (int r = 0; r < REG_ROUNDS; r++) {
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, REG_THREADS);
        pthread_t t[REG_THREADS];
        reg_arg a[REG_THREADS];
        for (int i = 0; i < REG_THREADS; i++) {
            /* Half the same block, half a range inside it: overlapping either way. */
            a[i] = (reg_arg){b->st, blk + (i % 2 ? 4096 : 0), i % 2 ? 8192 : bytes, &go, MT_OK};
            CHECK(pthread_create(&t[i], NULL, register_thread, &a[i]) == 0);
        }
        int ok = 0;
        void *winner = NULL;
        for (int i = 0; i < REG_THREADS; i++) {
            pthread_join(t[i], NULL);
            if (a[i].status == MT_OK) {
                ok++;
                winner = a[i].ptr;
            }
        }
        pthread_barrier_destroy(&go);
        CHECK_MSG(ok == 1, "round %d: %d of %d overlapping registrations succeeded", r, ok,
                  REG_THREADS);
        if (winner) CHECK_OK(mt_stager_unregister(b->st, winner));
    }
    mt_host_tier_free(b->dev, blk);
}

/* n copies of chunk bytes in flight at once, then waited for. */
static void copies_in_flight(bufs *b, size_t n, size_t chunk) {
    mt_stage_copy **c = calloc(n, sizeof *c);
    if (!c) return;
    for (size_t i = 0; i < n; i++)
        CHECK_OK(mt_stage_copy_async(b->st, b->device + i * chunk, b->host + i * chunk, chunk,
                                     MT_COPY_HOST_TO_DEVICE, &c[i]));
    for (size_t i = 0; i < n; i++)
        if (c[i]) CHECK_OK(mt_stage_wait(c[i]));
    free(c);
}

static void test_handle_pool(bufs *b) {
    mt_stager_stats s0, s1, s2;
    mt_stager_get_stats(b->st, &s0);
    size_t n = s0.pool_limit;
    CHECK(n > 0 && s0.handles_pooled <= n);
    copies_in_flight(b, n, BIG / n);
    mt_stager_get_stats(b->st, &s1);
    CHECK_MSG(s1.handles_allocated - s0.handles_allocated <= n, "%zu handles allocated for %zu "
              "copies", s1.handles_allocated - s0.handles_allocated, n);
    enum { ROUNDS = 20 };
    for (int r = 0; r < ROUNDS; r++) copies_in_flight(b, n, BIG / n);
    mt_stager_get_stats(b->st, &s2);
    CHECK_MSG(s2.handles_allocated == s1.handles_allocated, "%d rounds of %zu copies allocated "
              "%zu new handles (the pool should have served them)", ROUNDS, n,
              s2.handles_allocated - s1.handles_allocated);
    CHECK(s2.copies - s1.copies == (size_t)ROUNDS * n);
    CHECK(s2.handles_pooled == n);
    /* Twice the pool in flight: the extra handles are allocated, then freed, not kept. */
    copies_in_flight(b, 2 * n, BIG / (2 * n));
    mt_stager_get_stats(b->st, &s2);
    CHECK(s2.handles_allocated - s1.handles_allocated == n);
    CHECK_MSG(s2.handles_pooled == n, "%zu handles pooled, limit %zu", s2.handles_pooled, n);
    printf("handle pool: %zu copies, %zu handles allocated, %zu pooled (limit %zu), %zu waits "
           "found their copy running\n", s2.copies, s2.handles_allocated, s2.handles_pooled,
           s2.pool_limit, s2.waits);
}

/* Two threads copying at once through one stager (as FSDP's backward and a prefetch could):
 * each keeps IN_FLIGHT copies going into its own half, the bytes arrive, and the handles come
 * from the shared pool: no more allocated than were in flight at once. */
enum { POOL_THREADS = 2, IN_FLIGHT = 8, POOL_ROUNDS = 50 };

typedef struct pool_arg {
    bufs *b;
    size_t base, chunk;
    int failures;
} pool_arg;

static void *pool_thread(void *p) {
    pool_arg *a = p;
    for (int r = 0; r < POOL_ROUNDS; r++) {
        mt_stage_copy *c[IN_FLIGHT] = {0};
        for (int i = 0; i < IN_FLIGHT; i++) {
            size_t at = a->base + (size_t)i * a->chunk;
            if (mt_stage_copy_async(a->b->st, a->b->device + at, a->b->host + at, a->chunk,
                                    MT_COPY_HOST_TO_DEVICE, &c[i]) != MT_OK)
                a->failures++;
        }
        for (int i = 0; i < IN_FLIGHT; i++)
            if (c[i] && mt_stage_wait(c[i]) != MT_OK) a->failures++;
    }
    return NULL;
}

static void test_pool_two_threads(bufs *b) {
    size_t chunk = BIG / (POOL_THREADS * IN_FLIGHT);
    test_fill_bytes(b->host, BIG, 55);
    memset(b->device, 0, BIG);
    mt_stager_stats s0, s1;
    mt_stager_get_stats(b->st, &s0);
    pthread_t t[POOL_THREADS];
    pool_arg a[POOL_THREADS];
    for (int i = 0; i < POOL_THREADS; i++) {
        a[i] = (pool_arg){b, (size_t)i * IN_FLIGHT * chunk, chunk, 0};
        CHECK(pthread_create(&t[i], NULL, pool_thread, &a[i]) == 0);
    }
    for (int i = 0; i < POOL_THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK_MSG(a[i].failures == 0, "thread %d: %d copies failed", i, a[i].failures);
    }
    CHECK(memcmp(b->device, b->host, BIG) == 0);
    mt_stager_get_stats(b->st, &s1);
    CHECK(s1.copies - s0.copies == (size_t)POOL_THREADS * IN_FLIGHT * POOL_ROUNDS);
    /* The pool was full before: nothing new is needed for 16 in flight. */
    CHECK_MSG(s1.handles_allocated == s0.handles_allocated, "%zu handles allocated by two "
              "threads with %d copies in flight each", s1.handles_allocated - s0.handles_allocated,
              IN_FLIGHT);
    CHECK(s1.handles_pooled <= s1.pool_limit);
    /* The device-copy path keeps an event per handle: no more events than handles ever made
     * (the UCX path makes none). */
    pthread_mutex_lock(&b->st->mu);
    size_t events = b->st->events_created;
    pthread_mutex_unlock(&b->st->mu);
    CHECK_MSG(events <= s1.handles_allocated, "%zu events for %zu handles", events,
              s1.handles_allocated);
}

/* A copy that fails on the staging thread: its error comes back from test and wait. */
static void test_copy_failure(bufs *b) {
    /* The variable is read once, by mt_stager_create; the hook plays it for one copy. */
    mt_stager_inject_copy_failure(b->st, true);
    mt_stage_copy *c = NULL;
    mt_status s = mt_stage_copy_async(b->st, b->device, b->host, 4096, MT_COPY_HOST_TO_DEVICE, &c);
    mt_stager_inject_copy_failure(b->st, false);
    CHECK_OK(s);
    if (!c) return;
    bool done = false;
    while (!done) {
        s = mt_stage_test(c, &done);
        if (s != MT_OK) break;
    }
    CHECK(done && s == MT_ERR_COMM);
    CHECK(mt_stage_wait(c) == MT_ERR_COMM);
    CHECK_MSG(strstr(mt_last_error(), "4096 bytes") &&
                  strstr(mt_last_error(), "MT_TEST_STAGE_COPY_FAIL"), "%s", mt_last_error());
    copy_both_ways(b, 4095, 0, 0, 98); /* the next copy is fine */
}

/* A copy not waited for: destroy refuses and leaves the stager whole. */
static void test_destroy_with_handle(bufs *b) {
    mt_stage_copy *c = NULL;
    CHECK_OK(mt_stage_copy_async(b->st, b->device, b->host, 4096, MT_COPY_HOST_TO_DEVICE, &c));
    mt_stager_stats s0, s1;
    mt_stager_get_stats(b->st, &s0);
    mt_stager_destroy(b->st); /* logs an error, frees nothing */
    if (c) CHECK_OK(mt_stage_wait(c));
    mt_stager_get_stats(b->st, &s1); /* still there: the handle went back to its pool */
    CHECK(s1.handles_pooled == s0.handles_pooled + 1 || s0.handles_pooled == s0.pool_limit);
    copy_both_ways(b, 4095, 0, 0, 99); /* still works */
}

int main(void) {
    bufs b = {0};
    CHECK_OK(mt_device_open_cpu(0, &b.dev));
    CHECK_OK(mt_stager_create(b.dev, &b.st));
    if (!b.st) return check_report("test_stage");
    CHECK(mt_stager_path(b.st) == MT_STAGE_PATH_UCX);
    CHECK_OK(mt_host_tier_alloc(b.dev, BIG + SLACK, MT_MEM_PARAMS, (void **)&b.host));
    CHECK_OK(mt_device_alloc(b.dev, BIG + SLACK, MT_MEM_PARAMS, (void **)&b.device));
    CHECK_OK(mt_stager_register(b.st, b.host, BIG + SLACK));
    CHECK_OK(mt_stager_register(b.st, b.device, BIG + SLACK));

    size_t sizes[] = {0, 1, 4095, BIG};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        copy_both_ways(&b, sizes[i], 0, 0, (unsigned)i);
        copy_both_ways(&b, sizes[i], 3, 4093, (unsigned)i + 10);
    }
    test_many_in_flight(&b);
    test_errors(&b);
    test_concurrent_register(&b);
    test_handle_pool(&b);
    test_pool_two_threads(&b);
    test_copy_failure(&b);
    test_destroy_with_handle(&b);

    CHECK_OK(mt_stager_unregister(b.st, b.host));
    CHECK(mt_stager_unregister(b.st, b.host) == MT_ERR_INVALID_ARG);
    /* The device region stays registered: destroy releases it. */
    mt_stager_destroy(b.st);
    mt_host_tier_free(b.dev, b.host);
    mt_device_free(b.dev, b.device);
    mt_device_close(b.dev);
    return check_report("test_stage");
}
