/* The CUDA device on a GPU: the caching allocator (reuse, no reuse with MT_CUDA_CACHE_BYTES=0),
 * copies both ways, memset, streams and events, pinned host memory, accounting equal to the CPU
 * device's for the same sequence, and the out-of-memory message. Exits 77 (ctest: skipped) when
 * there is no GPU. */
#include "core/cuda/block_cache.h"
#include "core/cuda/cuda_internal.h"

#include "check.h"

#include <meshtrain/device.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SKIPPED 77
#define MIB ((size_t)1 << 20)

static bool caching_off(void) {
    const char *env = getenv("MT_CUDA_CACHE_BYTES");
    return env && strcmp(env, "0") == 0;
}

static void test_reuse(mt_device *dev) {
    size_t sizes[] = {1000, 3 * MIB + 5};
    for (int k = 0; k < 2; k++) {
        mt_cuda_alloc_stats before, after;
        CHECK_OK(mt_cuda_device_alloc_stats(dev, &before));
        void *a = NULL, *b = NULL;
        CHECK_OK(mt_device_alloc(dev, sizes[k], MT_MEM_ACTIVATIONS, &a));
        mt_device_free(dev, a);
        /* After a device synchronisation the freed block is known idle and must be reused. */
        CHECK_OK(mt_device_synchronize(dev));
        CHECK_OK(mt_device_alloc(dev, sizes[k], MT_MEM_ACTIVATIONS, &b));
        CHECK_OK(mt_cuda_device_alloc_stats(dev, &after));
        if (caching_off()) {
            CHECK(after.reuses == before.reuses);
            CHECK(after.mallocs == before.mallocs + 2);
        } else {
            CHECK_MSG(b == a, "size %zu: %p was freed, got %p", sizes[k], a, b);
            CHECK(after.reuses == before.reuses + 1);
            CHECK(after.mallocs == before.mallocs + 1);
        }
        CHECK(after.live_bytes == before.live_bytes + mt_block_round(sizes[k]));
        mt_device_free(dev, b);
    }
    CHECK_OK(mt_cuda_device_empty_cache(dev));
    mt_cuda_alloc_stats s;
    CHECK_OK(mt_cuda_device_alloc_stats(dev, &s));
    CHECK(s.cached_bytes == 0 && s.cached_blocks == 0);
}

static void test_copies(mt_device *dev) {
    enum { N = 1 << 20 };
    unsigned char *host = malloc(N), *back = malloc(N);
    void *d1 = NULL, *d2 = NULL;
    CHECK(host && back);
    if (!host || !back) goto out;
    for (size_t i = 0; i < N; i++) host[i] = (unsigned char)(i * 31 + 7);
    CHECK_OK(mt_device_alloc(dev, N, MT_MEM_OTHER, &d1));
    CHECK_OK(mt_device_alloc(dev, N, MT_MEM_OTHER, &d2));
    if (!d1 || !d2) goto out;
    CHECK_OK(mt_device_copy(dev, d1, host, N, MT_COPY_HOST_TO_DEVICE, NULL));
    CHECK_OK(mt_device_copy(dev, d2, d1, N, MT_COPY_DEVICE_TO_DEVICE, NULL));
    memset(back, 0, N);
    CHECK_OK(mt_device_copy(dev, back, d2, N, MT_COPY_DEVICE_TO_HOST, NULL));
    CHECK(memcmp(host, back, N) == 0);

    CHECK_OK(mt_device_memset(dev, d2, 0xab, N / 2, NULL));
    CHECK_OK(mt_device_copy(dev, back, d2, N, MT_COPY_DEVICE_TO_HOST, NULL));
    size_t bad = 0;
    for (size_t i = 0; i < N; i++) bad += back[i] != (i < N / 2 ? 0xab : host[i]);
    CHECK_MSG(bad == 0, "%zu byte(s) wrong after memset of the first half", bad);
out:
    mt_device_free(dev, d1);
    mt_device_free(dev, d2);
    free(host);
    free(back);
}

/* Stream a fills a block; stream b waits for a's event and copies it into pinned memory. */
static void test_streams(mt_device *dev) {
    enum { N = 8 << 20 };
    mt_stream *a = NULL, *b = NULL;
    mt_event *ev = NULL;
    void *d = NULL;
    unsigned char *pinned = NULL;
    CHECK_OK(mt_stream_create(dev, &a));
    CHECK_OK(mt_stream_create(dev, &b));
    CHECK_OK(mt_event_create(dev, &ev));
    CHECK_OK(mt_device_alloc(dev, N, MT_MEM_COMM, &d));
    CHECK_OK(mt_cuda_host_alloc(N, (void **)&pinned));
    if (!a || !b || !ev || !d || !pinned) goto out;
    memset(pinned, 0, N);
    for (int round = 1; round <= 3; round++) {
        CHECK_OK(mt_device_memset(dev, d, round, N, a));
        CHECK_OK(mt_event_record(ev, a));
        CHECK_OK(mt_stream_wait_event(b, ev));
        CHECK_OK(mt_device_copy(dev, pinned, d, N, MT_COPY_DEVICE_TO_HOST, b));
        CHECK_OK(mt_stream_synchronize(b));
        bool done = false;
        CHECK_OK(mt_event_query(ev, &done));
        CHECK(done);
        size_t bad = 0;
        for (size_t i = 0; i < N; i++) bad += pinned[i] != round;
        CHECK_MSG(bad == 0, "round %d: %zu byte(s) not copied after the event", round, bad);
    }
    /* A block freed while streams exist, then asked for again: reused or fresh, it is usable. */
    mt_device_free(dev, d);
    d = NULL;
    CHECK_OK(mt_device_alloc(dev, N, MT_MEM_COMM, &d));
    if (d) {
        CHECK_OK(mt_device_memset(dev, d, 9, N, b));
        CHECK_OK(mt_device_copy(dev, pinned, d, N, MT_COPY_DEVICE_TO_HOST, b));
        CHECK_OK(mt_stream_synchronize(b));
        CHECK(pinned[0] == 9 && pinned[N - 1] == 9);
    }
out:
    mt_device_free(dev, d);
    mt_cuda_host_free(pinned);
    mt_event_destroy(ev);
    mt_stream_destroy(a);
    mt_stream_destroy(b);
}

/* The same sequence of allocations and frees on both devices: the figures must agree. */
static void run_sequence(mt_device *dev, mt_mem_stats *out) {
    static const size_t sizes[] = {1, 0, 511, 4096, 3 * MIB, 5 * MIB + 3, 100, 2 * MIB, 7777};
    enum { N = sizeof sizes / sizeof sizes[0] };
    void *p[N] = {0};
    mt_device_reset_peaks(dev);
    for (int i = 0; i < N; i++)
        CHECK_OK(mt_device_alloc(dev, sizes[i], (mt_mem_category)(i % MT_MEM_CATEGORY_COUNT), &p[i]));
    for (int i = 0; i < N; i += 2) mt_device_free(dev, p[i]);
    for (int i = 0; i < N; i += 2)
        CHECK_OK(mt_device_alloc(dev, sizes[i] + 1, (mt_mem_category)((i + 1) % MT_MEM_CATEGORY_COUNT),
                                 &p[i]));
    mt_device_mem_stats(dev, out);
    for (int i = 0; i < N; i++) mt_device_free(dev, p[i]);
}

static void test_accounting(mt_device *gpu) {
    mt_device *cpu = NULL;
    CHECK_OK(mt_device_open_cpu(0, &cpu));
    if (!cpu) return;
    mt_mem_stats g, c, g_end, c_end;
    run_sequence(gpu, &g);
    run_sequence(cpu, &c);
    for (int k = 0; k < MT_MEM_CATEGORY_COUNT; k++) {
        CHECK_MSG(g.current[k] == c.current[k], "%s: current %zu on the GPU, %zu on the CPU",
                  mt_mem_category_name((mt_mem_category)k), g.current[k], c.current[k]);
        CHECK_MSG(g.peak[k] == c.peak[k], "%s: peak %zu on the GPU, %zu on the CPU",
                  mt_mem_category_name((mt_mem_category)k), g.peak[k], c.peak[k]);
    }
    CHECK(g.total_current == c.total_current && g.total_peak == c.total_peak);
    mt_device_mem_stats(gpu, &g_end);
    mt_device_mem_stats(cpu, &c_end);
    CHECK(g_end.total_current == 0 && c_end.total_current == 0);
    mt_device_close(cpu);
}

static void test_oom(mt_device *dev) {
    /* Keep one block cached, so that the message has a cache to report and empty. */
    void *keep = NULL, *cached = NULL, *huge = (void *)1;
    CHECK_OK(mt_device_alloc(dev, 4 * MIB, MT_MEM_PARAMS, &keep));
    CHECK_OK(mt_device_alloc(dev, 6 * MIB, MT_MEM_GRADS, &cached));
    mt_device_free(dev, cached);
    mt_mem_stats before, after;
    mt_device_mem_stats(dev, &before);
    mt_status st = mt_device_alloc(dev, (size_t)1 << 52, MT_MEM_ACTIVATIONS, &huge);
    CHECK(st == MT_ERR_OUT_OF_MEMORY);
    CHECK(huge == NULL);
    const char *msg = mt_last_error();
    printf("out-of-memory message: %s\n", msg);
    const char *needles[] = {"out of memory", "cuda:0", "activations", "4.00 PiB", "allocated",
                             "cached", "largest", "cudaMemGetInfo"};
    for (size_t i = 0; i < sizeof needles / sizeof *needles; i++)
        CHECK_MSG(strstr(msg, needles[i]) != NULL, "the message lacks \"%s\"", needles[i]);
    if (!caching_off())
        CHECK_MSG(strstr(msg, "6.00 MiB cached") != NULL, "the message lacks the cached block");
    mt_device_mem_stats(dev, &after);
    CHECK(after.total_current == before.total_current);
    CHECK(after.current[MT_MEM_ACTIVATIONS] == before.current[MT_MEM_ACTIVATIONS]);
    mt_cuda_alloc_stats s;
    CHECK_OK(mt_cuda_device_alloc_stats(dev, &s));
    CHECK_MSG(s.cached_bytes == 0, "%zu bytes still cached after an out-of-memory retry",
              s.cached_bytes);
    /* The device still works. */
    void *again = NULL;
    CHECK_OK(mt_device_alloc(dev, MIB, MT_MEM_OTHER, &again));
    mt_device_free(dev, again);
    mt_device_free(dev, keep);
}

int main(void) {
    char why[256];
    int count = mt_device_cuda_count(why, sizeof why);
    if (count <= 0) {
        printf("SKIPPED: no GPU (%s)\n", why);
        return SKIPPED;
    }
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open(MT_DEVICE_CUDA, 0, &dev));
    if (!dev) return check_report("test_gpu_device");
    CHECK(mt_device_get_kind(dev) == MT_DEVICE_CUDA && !mt_device_is_fallback(dev));
    test_reuse(dev);
    test_copies(dev);
    test_streams(dev);
    test_accounting(dev);
    test_oom(dev);
    mt_mem_stats s;
    mt_device_mem_stats(dev, &s);
    CHECK(s.total_current == 0);
    mt_device_close(dev);
    return check_report("test_gpu_device");
}
