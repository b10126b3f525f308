/* The host memory tier (include/meshtrain/host_memory.h): its accounting is its own (a host block
 * never shows in the device's stats and the device's capacity does not limit it), current and
 * peak per category, refusal past MT_HOST_MEMORY naming the category, the report's host lines,
 * leak release at close, and an injected allocation failure.
 *
 * With --mlock-refusal LIMIT (tests/core/core.cmake runs it under prlimit --memlock=LIMIT, with
 * CAP_IPC_LOCK dropped so that root is limited too) and MT_HOST_MLOCK=1: a block under the limit
 * is locked, one over it is refused with a message naming RLIMIT_MEMLOCK, its value and the fix,
 * and nothing is charged for it.
 *
 * Concurrent allocations and frees from several threads (the tier is documented as thread-safe):
 * the block table's slot used to be checked and filled in separate critical sections, so the
 * table overflowed (seen under ASan) and the counts drifted. */
#include "check.h"

#include <meshtrain/device.h>
#include <meshtrain/host_memory.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void test_accounting(void) {
    mt_device *dev = NULL;
    /* A 1 MiB device: the host tier lives outside it. */
    CHECK_OK(mt_device_open_cpu(1u << 20, &dev));
    void *master = NULL, *adam = NULL, *empty = NULL, *grad = NULL;
    CHECK_OK(mt_host_tier_alloc(dev, 8u << 20, MT_MEM_PARAMS, &master));
    CHECK_OK(mt_host_tier_alloc(dev, 16u << 20, MT_MEM_OPTIMIZER, &adam));
    CHECK_OK(mt_host_tier_alloc(dev, 0, MT_MEM_GRADS, &empty));
    CHECK(master && adam && empty && master != adam && empty != master && empty != adam);
    CHECK(((uintptr_t)master & 4095) == 0 && ((uintptr_t)empty & 4095) == 0);
    memset(master, 1, 8u << 20);
    memset(adam, 2, 16u << 20);

    mt_mem_stats host, device;
    mt_host_mem_stats(dev, &host);
    mt_device_mem_stats(dev, &device);
    CHECK(host.current[MT_MEM_PARAMS] == (8u << 20));
    CHECK(host.current[MT_MEM_OPTIMIZER] == (16u << 20));
    CHECK(host.current[MT_MEM_GRADS] == 0);
    CHECK(host.total_current == (24u << 20) && host.total_peak == (24u << 20));
    CHECK(device.total_current == 0 && device.total_peak == 0);
    CHECK(mt_host_tier_contains(dev, (char *)adam + 100, 1000));
    CHECK(mt_host_tier_contains(dev, adam, 16u << 20));
    CHECK(!mt_host_tier_contains(dev, (char *)adam + 1, 16u << 20));

    char report[2048];
    mt_memory_report(dev, report, sizeof report);
    CHECK_MSG(strstr(report, "host memory tier:") && strstr(report, "16.00 MiB"), "%s", report);

    mt_host_tier_free(dev, adam);
    CHECK_OK(mt_host_tier_alloc(dev, 4u << 20, MT_MEM_GRADS, &grad));
    mt_host_mem_stats(dev, &host);
    CHECK(host.current[MT_MEM_OPTIMIZER] == 0 && host.peak[MT_MEM_OPTIMIZER] == (16u << 20));
    CHECK(host.current[MT_MEM_GRADS] == (4u << 20) && host.peak[MT_MEM_GRADS] == (4u << 20));
    CHECK(host.total_current == (12u << 20) && host.total_peak == (24u << 20));
    CHECK(!mt_host_tier_contains(dev, adam, 1));
    mt_device_reset_peaks(dev);
    mt_host_mem_stats(dev, &host);
    CHECK(host.total_peak == (12u << 20) && host.peak[MT_MEM_OPTIMIZER] == 0);

    /* A pointer it did not hand out is ignored (logged), not freed or uncharged. */
    int stack_var;
    mt_host_tier_free(dev, &stack_var);
    mt_host_mem_stats(dev, &host);
    CHECK(host.total_current == (12u << 20));
    CHECK(mt_host_tier_alloc(dev, 1, MT_MEM_CATEGORY_COUNT, &adam) == MT_ERR_INVALID_ARG);

    mt_host_tier_free(dev, master);
    mt_host_tier_free(dev, empty);
    /* grad is left allocated: close reports it and releases it (ASan would see a leak). */
    mt_device_close(dev);
}

static void test_capacity(void) {
    setenv("MT_HOST_MEMORY", "10MiB", 1);
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    unsetenv("MT_HOST_MEMORY");
    mt_mem_stats host;
    mt_host_mem_stats(dev, &host);
    CHECK(host.capacity == (10u << 20));
    void *a = NULL, *b = NULL;
    CHECK_OK(mt_host_tier_alloc(dev, 6u << 20, MT_MEM_PARAMS, &a));
    mt_status st = mt_host_tier_alloc(dev, 6u << 20, MT_MEM_OPTIMIZER, &b);
    CHECK(st == MT_ERR_OUT_OF_MEMORY && b == NULL);
    const char *msg = mt_last_error();
    CHECK_MSG(strstr(msg, "out of host memory") && strstr(msg, "optimizer") &&
              strstr(msg, "6.00 MiB") && strstr(msg, "4.00 MiB left of 10.00 MiB") &&
              strstr(msg, "MT_HOST_MEMORY"), "%s", msg);
    mt_host_mem_stats(dev, &host);
    CHECK(host.total_current == (6u << 20) && host.current[MT_MEM_OPTIMIZER] == 0);
    CHECK_OK(mt_host_tier_alloc(dev, 4u << 20, MT_MEM_OPTIMIZER, &b));
    mt_host_tier_free(dev, a);
    mt_host_tier_free(dev, b);
    mt_device_close(dev);

    setenv("MT_HOST_MEMORY", "lots", 1);
    st = mt_device_open_cpu(0, &dev);
    unsetenv("MT_HOST_MEMORY");
    CHECK(st == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "MT_HOST_MEMORY=lots is not a byte count"), "%s", mt_last_error());
}

static void test_injected_failure(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    setenv("MT_TEST_HOST_ALLOC_FAIL", "1", 1);
    void *p = NULL;
    mt_status st = mt_host_tier_alloc(dev, 1u << 20, MT_MEM_GRADS, &p);
    unsetenv("MT_TEST_HOST_ALLOC_FAIL");
    CHECK(st == MT_ERR_OUT_OF_MEMORY && p == NULL);
    CHECK_MSG(strstr(mt_last_error(), "grads") && strstr(mt_last_error(), "host tier"), "%s",
              mt_last_error());
    mt_mem_stats host;
    mt_host_mem_stats(dev, &host);
    CHECK(host.total_current == 0 && host.total_peak == 0);
    mt_device_close(dev);
}

/* Run under prlimit --memlock=limit with MT_HOST_MLOCK=1. */
static void test_mlock_refusal(size_t limit) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    void *small = NULL, *big = NULL;
    CHECK_OK(mt_host_tier_alloc(dev, limit / 4, MT_MEM_PARAMS, &small));
    mt_status st = mt_host_tier_alloc(dev, 4 * limit, MT_MEM_OPTIMIZER, &big);
    CHECK(st == MT_ERR_OUT_OF_MEMORY && big == NULL);
    const char *msg = mt_last_error();
    char lim[32];
    snprintf(lim, sizeof lim, "RLIMIT_MEMLOCK is %s", mt_format_bytes(limit, (char[32]){0}, 32));
    CHECK_MSG(strstr(msg, "mlock") && strstr(msg, lim) && strstr(msg, "optimizer") &&
              strstr(msg, "ulimit -l") && strstr(msg, "prlimit --memlock") &&
              strstr(msg, "MT_HOST_MLOCK"), "%s", msg);
    printf("refused as it should be: %s\n", msg);
    mt_mem_stats host;
    mt_host_mem_stats(dev, &host);
    CHECK(host.total_current == limit / 4 && host.current[MT_MEM_OPTIMIZER] == 0);
    mt_host_tier_free(dev, small);
    mt_device_close(dev);
}

enum { RACE_THREADS = 8, RACE_ROUNDS = 300, RACE_HELD = 24 };

typedef struct {
    mt_device *dev;
    int failures;
} race_arg;

/* Allocates RACE_HELD blocks, checks each is its own (a pattern written and read back), frees
 * them, RACE_ROUNDS times: every round grows and shrinks the table while the others do too. */
static void *race_thread(void *p) {
    race_arg *a = p;
    void *held[RACE_HELD];
    for (int r = 0; r < RACE_ROUNDS; r++) {
        int n = 0;
        for (; n < RACE_HELD; n++) {
            if (mt_host_tier_alloc(a->dev, 64, MT_MEM_COMM, &held[n]) != MT_OK) {
                a->failures++;
                break;
            }
            memset(held[n], n + 1, 64);
        }
        for (int i = 0; i < n; i++) {
            if (((unsigned char *)held[i])[63] != (unsigned char)(i + 1)) a->failures++;
            if (!mt_host_tier_contains(a->dev, held[i], 64)) a->failures++;
            mt_host_tier_free(a->dev, held[i]);
        }
    }
    return NULL;
}

static void test_concurrent(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(1u << 20, &dev));
    pthread_t t[RACE_THREADS];
    race_arg args[RACE_THREADS];
    for (int i = 0; i < RACE_THREADS; i++) {
        args[i] = (race_arg){dev, 0};
        CHECK(pthread_create(&t[i], NULL, race_thread, &args[i]) == 0);
    }
    for (int i = 0; i < RACE_THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK_MSG(args[i].failures == 0, "thread %d: %d failures", i, args[i].failures);
    }
    mt_mem_stats host;
    mt_host_mem_stats(dev, &host);
    CHECK_MSG(host.total_current == 0 && host.current[MT_MEM_COMM] == 0, "%zu bytes left charged",
              (size_t)host.total_current);
    CHECK(host.peak[MT_MEM_COMM] <= (size_t)RACE_THREADS * RACE_HELD * 64);
    mt_device_close(dev);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--mlock-refusal") == 0) {
        test_mlock_refusal((size_t)strtoull(argv[2], NULL, 10));
        return check_report("test_host_tier --mlock-refusal");
    }
    test_accounting();
    test_capacity();
    test_injected_failure();
    test_concurrent();
    return check_report("test_host_tier");
}
