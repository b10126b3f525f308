/* The device interface on the CPU: accounting per category, the capacity and its out-of-memory
 * error, external charges past the capacity, MT_CPU_DEVICE_MEMORY, bad frees, leak reports,
 * copies, streams and events, threads, and opening CUDA (falls back to the CPU here; on a GPU
 * machine the GPU is exercised instead). */
#include "check.h"
#include "core/device_internal.h"

#include <meshtrain/device.h>
#include <meshtrain/log.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1024u * 1024u)
#define KiB 1024u

/* ---- capturing stderr, where warnings and notices go ----------------------------------------- */

typedef struct capture {
    int saved_fd;
    FILE *file;
    char text[8192];
} capture;

static void capture_begin(capture *c) {
    fflush(stderr);
    c->file = tmpfile();
    c->saved_fd = dup(STDERR_FILENO);
    if (c->file) dup2(fileno(c->file), STDERR_FILENO);
}

static const char *capture_end(capture *c) {
    fflush(stderr);
    dup2(c->saved_fd, STDERR_FILENO);
    close(c->saved_fd);
    c->text[0] = '\0';
    if (c->file) {
        rewind(c->file);
        size_t n = fread(c->text, 1, sizeof c->text - 1, c->file);
        c->text[n] = '\0';
        fclose(c->file);
    }
    return c->text;
}

/* ---- accounting ------------------------------------------------------------------------------ */

static void test_accounting(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return;
    CHECK(mt_device_get_kind(dev) == MT_DEVICE_CPU);
    CHECK(strcmp(mt_device_name(dev), "cpu") == 0);
    CHECK(!mt_device_is_fallback(dev));

    void *a = NULL, *b = NULL, *c = NULL, *z1 = NULL, *z2 = NULL;
    CHECK_OK(mt_device_alloc(dev, 3 * MiB, MT_MEM_PARAMS, &a));
    CHECK_OK(mt_device_alloc(dev, 1000, MT_MEM_GRADS, &b));
    CHECK_OK(mt_device_alloc(dev, 2 * MiB, MT_MEM_PARAMS, &c));
    CHECK_OK(mt_device_alloc(dev, 0, MT_MEM_OTHER, &z1));
    CHECK_OK(mt_device_alloc(dev, 0, MT_MEM_OTHER, &z2));
    CHECK(a && b && c && z1 && z2);
    CHECK(z1 != z2); /* zero bytes still give unique pointers */
    void *all[] = {a, b, c, z1, z2};
    for (int i = 0; i < 5; i++)
        CHECK_MSG(((uintptr_t)all[i] % 256) == 0, "pointer %p is not 256-byte aligned", all[i]);
    memset(a, 1, 3 * MiB); /* the memory is really there */
    memset(b, 2, 1000);

    mt_mem_stats s;
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_PARAMS] == 5 * MiB);
    CHECK(s.current[MT_MEM_GRADS] == 1000);
    CHECK(s.current[MT_MEM_OTHER] == 0);
    CHECK(s.total_current == 5 * MiB + 1000);
    CHECK(s.peak[MT_MEM_PARAMS] == 5 * MiB);
    CHECK(s.total_peak == 5 * MiB + 1000);
    CHECK(s.capacity == 0);

    mt_device_free(dev, c);
    mt_device_free(dev, a);
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_PARAMS] == 0);
    CHECK(s.peak[MT_MEM_PARAMS] == 5 * MiB); /* the peak stays */
    CHECK(s.total_current == 1000);
    CHECK(s.total_peak == 5 * MiB + 1000);

    mt_device_reset_peaks(dev);
    mt_device_mem_stats(dev, &s);
    CHECK(s.peak[MT_MEM_PARAMS] == 0);
    CHECK(s.peak[MT_MEM_GRADS] == 1000);
    CHECK(s.total_peak == 1000);

    void *d = NULL;
    CHECK_OK(mt_device_alloc(dev, 4 * KiB, MT_MEM_ACTIVATIONS, &d));
    mt_device_mem_stats(dev, &s);
    CHECK(s.peak[MT_MEM_ACTIVATIONS] == 4 * KiB);
    CHECK(s.total_peak == 4 * KiB + 1000);

    void *bad = (void *)0x1;
    CHECK(mt_device_alloc(dev, 8, (mt_mem_category)99, &bad) == MT_ERR_INVALID_ARG);
    CHECK(bad == NULL);
    CHECK(mt_device_alloc(dev, 8, MT_MEM_OTHER, NULL) == MT_ERR_INVALID_ARG);

    mt_device_free(dev, NULL); /* ignored */
    mt_device_free(dev, d);
    mt_device_free(dev, b);
    mt_device_free(dev, z1);
    mt_device_free(dev, z2);
    mt_device_mem_stats(dev, &s);
    CHECK(s.total_current == 0);
    capture cap;
    capture_begin(&cap);
    mt_device_close(dev);
    const char *err = capture_end(&cap);
    CHECK_MSG(strstr(err, "still allocated") == NULL, "a clean close reported a leak: %s", err);
}

/* Many blocks freed in a scattered order: every free must find its block. */
static void test_many_blocks(void) {
    enum { N = 2000 };
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return;
    static void *ptrs[N];
    size_t expected = 0;
    for (int i = 0; i < N; i++) {
        CHECK_OK(mt_device_alloc(dev, (size_t)(i % 7) * 16, (mt_mem_category)(i % 6), &ptrs[i]));
        expected += (size_t)(i % 7) * 16;
    }
    mt_mem_stats s;
    mt_device_mem_stats(dev, &s);
    CHECK(s.total_current == expected);
    capture cap;
    capture_begin(&cap);
    for (int k = 0; k < N; k++) {
        int i = (int)(((long)k * 7919) % N); /* 7919 is prime: a permutation of 0..N-1 */
        mt_device_free(dev, ptrs[i]);
    }
    const char *err = capture_end(&cap);
    CHECK_MSG(err[0] == '\0', "frees complained: %.300s", err);
    mt_device_mem_stats(dev, &s);
    CHECK(s.total_current == 0);
    for (int c = 0; c < MT_MEM_CATEGORY_COUNT; c++) CHECK(s.current[c] == 0);
    mt_device_close(dev);
}

/* ---- capacity and out of memory -------------------------------------------------------------- */

static void test_out_of_memory(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(10 * MiB, &dev));
    if (!dev) return;
    void *p = NULL, *g = NULL, *x = NULL;
    CHECK_OK(mt_device_alloc(dev, 9 * MiB, MT_MEM_PARAMS, &p));
    CHECK_OK(mt_device_alloc(dev, 512 * KiB, MT_MEM_GRADS, &g));

    void *out = (void *)0x1;
    mt_status st = mt_device_alloc(dev, 1 * MiB, MT_MEM_ACTIVATIONS, &out);
    CHECK(st == MT_ERR_OUT_OF_MEMORY);
    CHECK(out == NULL);
    const char *msg = mt_last_error();
    const char *parts[] = {"out of memory", "cpu", "activations", "asked 1.00 MiB",
                           "512.00 KiB left", "10.00 MiB", "params 9.00 MiB", "grads 512.00 KiB"};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        CHECK_MSG(strstr(msg, parts[i]) != NULL, "no \"%s\" in: %s", parts[i], msg);

    mt_mem_stats s;
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_ACTIVATIONS] == 0); /* a refused request is not charged */
    CHECK(s.peak[MT_MEM_ACTIVATIONS] == 0);
    CHECK(s.total_current == 9 * MiB + 512 * KiB);
    CHECK(s.capacity == 10 * MiB);

    /* Exactly what is left still fits; one byte more does not. */
    CHECK_OK(mt_device_alloc(dev, 512 * KiB, MT_MEM_ACTIVATIONS, &x));
    CHECK(mt_device_alloc(dev, 1, MT_MEM_OTHER, &out) == MT_ERR_OUT_OF_MEMORY);
    void *z = NULL;
    CHECK_OK(mt_device_alloc(dev, 0, MT_MEM_OTHER, &z)); /* nothing asked, nothing refused */
    mt_device_free(dev, z);
    mt_device_free(dev, p);
    CHECK_OK(mt_device_alloc(dev, 9 * MiB, MT_MEM_OPTIMIZER, &p)); /* freed memory is reusable */
    mt_device_free(dev, p);
    mt_device_free(dev, g);
    mt_device_free(dev, x);

    /* A request no capacity check stops, refused by the host itself: an error, not a crash. */
    mt_device *unlimited = NULL;
    CHECK_OK(mt_device_open_cpu(0, &unlimited));
    if (unlimited) {
        st = mt_device_alloc(unlimited, SIZE_MAX - 100, MT_MEM_PARAMS, &out);
        CHECK(st == MT_ERR_OUT_OF_MEMORY);
        CHECK_MSG(strstr(mt_last_error(), "out of memory on cpu") != NULL, "%s", mt_last_error());
        CHECK_MSG(strstr(mt_last_error(), "params") != NULL, "%s", mt_last_error());
        st = mt_device_alloc(unlimited, (size_t)1 << 62, MT_MEM_GRADS, &out);
        CHECK(st == MT_ERR_OUT_OF_MEMORY);
        mt_device_mem_stats(unlimited, &s);
        CHECK(s.total_current == 0 && s.total_peak == 0);
        mt_device_close(unlimited);
    }
    mt_device_close(dev);
}

/* Memory charged from outside the allocator (NCCL's, say) can exceed the capacity: then nothing
 * is left, and an allocation is refused (the room left was computed as capacity minus use, which
 * wrapped around to almost 2^64 and let everything through). Released, there is room again; a
 * release of more than is charged is clamped and said. */
static void test_external_over_capacity(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(1 * MiB, &dev));
    if (!dev) return;
    mt_device_charge_external(dev, MT_MEM_COMM, 2 * MiB);
    mt_mem_stats s;
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_COMM] == 2 * MiB && s.total_current == 2 * MiB);
    void *p = (void *)0x1;
    mt_status st = mt_device_alloc(dev, 4 * KiB, MT_MEM_PARAMS, &p);
    CHECK_MSG(st == MT_ERR_OUT_OF_MEMORY, "4 KiB on a 1 MiB device with 2 MiB charged: %s",
              st == MT_OK ? "accepted" : mt_status_str(st));
    if (st == MT_OK) mt_device_free(dev, p);
    else CHECK(p == NULL);
    CHECK_MSG(strstr(mt_last_error(), "asked 4.00 KiB for params, 0 B left of 1.00 MiB") != NULL,
              "%s", mt_last_error());
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_PARAMS] == 0);

    mt_device_release_external(dev, MT_MEM_COMM, 2 * MiB);
    p = NULL;
    CHECK_OK(mt_device_alloc(dev, 4 * KiB, MT_MEM_PARAMS, &p));
    mt_device_free(dev, p);

    /* Releasing more than was charged: clamped to what was, with a warning. */
    mt_device_charge_external(dev, MT_MEM_COMM, 1 * KiB);
    capture cap;
    capture_begin(&cap);
    mt_device_release_external(dev, MT_MEM_COMM, 3 * KiB);
    const char *err = capture_end(&cap);
    CHECK_MSG(strstr(err, "releasing 3.00 KiB of external comm memory, but only 1.00 KiB is "
                          "charged") != NULL, "warning: '%s'", err);
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_COMM] == 0 && s.total_current == 0);
    mt_device_close(dev);
}

static void test_env_capacity(void) {
    mt_device *dev = NULL;
    mt_mem_stats s;
    setenv("MT_CPU_DEVICE_MEMORY", "3MiB", 1);
    CHECK_OK(mt_device_open(MT_DEVICE_CPU, 0, &dev));
    if (dev) {
        mt_device_mem_stats(dev, &s);
        CHECK(s.capacity == 3 * MiB);
        void *p = NULL;
        CHECK(mt_device_alloc(dev, 4 * MiB, MT_MEM_COMM, &p) == MT_ERR_OUT_OF_MEMORY);
        CHECK(strstr(mt_last_error(), "comm") != NULL);
        mt_device_close(dev);
    }

    setenv("MT_CPU_DEVICE_MEMORY", "12 banana", 1);
    dev = (mt_device *)0x1;
    CHECK(mt_device_open(MT_DEVICE_CPU, 0, &dev) == MT_ERR_INVALID_ARG);
    CHECK(dev == NULL);
    CHECK_MSG(strstr(mt_last_error(), "MT_CPU_DEVICE_MEMORY") &&
                  strstr(mt_last_error(), "12 banana"),
              "%s", mt_last_error());
    /* The explicit capacity ignores the environment. */
    CHECK_OK(mt_device_open_cpu(5 * MiB, &dev));
    if (dev) {
        mt_device_mem_stats(dev, &s);
        CHECK(s.capacity == 5 * MiB);
        mt_device_close(dev);
    }

    setenv("MT_CPU_DEVICE_MEMORY", "", 1);
    CHECK_OK(mt_device_open(MT_DEVICE_CPU, 0, &dev));
    if (dev) {
        mt_device_mem_stats(dev, &s);
        CHECK(s.capacity == 0);
        mt_device_close(dev);
    }
    unsetenv("MT_CPU_DEVICE_MEMORY");
    CHECK_OK(mt_device_open(MT_DEVICE_CPU, 0, &dev));
    if (dev) {
        mt_device_mem_stats(dev, &s);
        CHECK(s.capacity == 0);
        mt_device_close(dev);
    }

    CHECK(mt_device_open(MT_DEVICE_CPU, -1, &dev) == MT_ERR_INVALID_ARG);
    CHECK(mt_device_open((mt_device_kind)7, 0, &dev) == MT_ERR_INVALID_ARG);
    CHECK(mt_device_open(MT_DEVICE_CPU, 0, NULL) == MT_ERR_INVALID_ARG);
}

/* ---- bad frees and leaks --------------------------------------------------------------------- */

static void test_bad_free_and_leaks(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return;
    void *p = NULL, *q = NULL;
    CHECK_OK(mt_device_alloc(dev, 64, MT_MEM_OTHER, &p));
    int on_stack = 0;
    mt_mem_stats before, after;
    mt_device_mem_stats(dev, &before);

    capture cap;
    capture_begin(&cap);
    mt_device_free(dev, &on_stack);
    const char *err = capture_end(&cap);
    CHECK_MSG(strstr(err, "error") && strstr(err, "not allocated"), "stderr: %s", err);

    mt_device_free(dev, p);
    capture_begin(&cap);
    mt_device_free(dev, p); /* double free */
    err = capture_end(&cap);
    CHECK_MSG(strstr(err, "already freed"), "stderr: %s", err);
    mt_device_mem_stats(dev, &after);
    CHECK(after.total_current == before.total_current - 64);

    CHECK_OK(mt_device_alloc(dev, 3 * MiB, MT_MEM_PARAMS, &p));
    CHECK_OK(mt_device_alloc(dev, 2 * KiB, MT_MEM_OPTIMIZER, &q));
    capture_begin(&cap);
    mt_device_close(dev); /* reports and releases the two blocks (ASan would see them leak) */
    err = capture_end(&cap);
    CHECK_MSG(strstr(err, "warn") && strstr(err, "2 block(s) still allocated") &&
                  strstr(err, "params 3.00 MiB") && strstr(err, "optimizer 2.00 KiB"),
              "leak report: %s", err);
}

/* ---- copies, streams, events ----------------------------------------------------------------- */

static void test_copy_and_streams(mt_device *dev) {
    enum { N = 4096 };
    static unsigned char host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (unsigned char)(i * 31 + 7);
    void *a = NULL, *b = NULL;
    CHECK_OK(mt_device_alloc(dev, N, MT_MEM_OTHER, &a));
    CHECK_OK(mt_device_alloc(dev, N, MT_MEM_OTHER, &b));
    if (!a || !b) return;
    mt_stream *stream = NULL;
    mt_event *event = NULL;
    CHECK_OK(mt_stream_create(dev, &stream));
    CHECK_OK(mt_event_create(dev, &event));

    bool done = false;
    CHECK_OK(mt_event_query(event, &done)); /* never recorded: nothing to wait for */
    CHECK(done);
    CHECK_OK(mt_device_copy(dev, a, host, N, MT_COPY_HOST_TO_DEVICE, NULL));
    CHECK_OK(mt_device_memset(dev, b, 0xab, N, stream));
    CHECK_OK(mt_event_record(event, stream));
    CHECK_OK(mt_stream_wait_event(stream, event));
    CHECK_OK(mt_device_copy(dev, b, a, N / 2, MT_COPY_DEVICE_TO_DEVICE, stream));
    CHECK_OK(mt_event_record(event, stream));
    CHECK_OK(mt_event_synchronize(event));
    CHECK_OK(mt_event_query(event, &done));
    CHECK(done);
    CHECK_OK(mt_device_copy(dev, back, b, N, MT_COPY_DEVICE_TO_HOST, stream));
    CHECK_OK(mt_stream_synchronize(stream));
    CHECK_OK(mt_device_synchronize(dev));
    int bad = 0;
    for (int i = 0; i < N; i++)
        if (back[i] != (i < N / 2 ? host[i] : 0xab)) bad++;
    CHECK_MSG(bad == 0, "%d bytes differ after memset + copies on %s", bad, mt_device_name(dev));

    CHECK_OK(mt_device_copy(dev, NULL, NULL, 0, MT_COPY_HOST_TO_DEVICE, NULL)); /* zero bytes */
    CHECK(mt_device_copy(dev, NULL, host, 8, MT_COPY_HOST_TO_DEVICE, NULL) == MT_ERR_INVALID_ARG);
    CHECK(mt_device_copy(dev, a, host, 8, (mt_copy_kind)9, NULL) == MT_ERR_INVALID_ARG);
    CHECK(mt_device_memset(dev, NULL, 0, 8, NULL) == MT_ERR_INVALID_ARG);
    CHECK(mt_stream_synchronize(NULL) == MT_ERR_INVALID_ARG);
    CHECK(mt_event_record(NULL, stream) == MT_ERR_INVALID_ARG);
    CHECK(mt_stream_wait_event(stream, NULL) == MT_ERR_INVALID_ARG);

    /* Streams and events are checked against the device they are used with. */
    mt_device *other = NULL;
    CHECK_OK(mt_device_open_cpu(0, &other));
    if (other) {
        mt_stream *other_stream = NULL;
        mt_event *other_event = NULL;
        CHECK_OK(mt_stream_create(other, &other_stream));
        CHECK_OK(mt_event_create(other, &other_event));
        CHECK(mt_device_copy(dev, back, a, 8, MT_COPY_DEVICE_TO_HOST, other_stream) ==
              MT_ERR_INVALID_ARG);
        CHECK_MSG(strstr(mt_last_error(), "stream belongs to"), "%s", mt_last_error());
        CHECK(mt_device_memset(dev, a, 0, 8, other_stream) == MT_ERR_INVALID_ARG);
        CHECK(mt_event_record(event, other_stream) == MT_ERR_INVALID_ARG);
        CHECK(mt_stream_wait_event(stream, other_event) == MT_ERR_INVALID_ARG);
        mt_event_destroy(other_event);
        mt_stream_destroy(other_stream);
        mt_device_close(other);
    }
    mt_event_destroy(event);
    mt_stream_destroy(stream);
    mt_stream_destroy(NULL);
    mt_event_destroy(NULL);
    mt_device_free(dev, a);
    mt_device_free(dev, b);
}

/* ---- threads --------------------------------------------------------------------------------- */

typedef struct worker {
    mt_device *dev;
    unsigned seed;
    int failures; /* anything but OK or OUT_OF_MEMORY */
    int ooms;
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    void *held[8] = {0};
    for (int i = 0; i < 3000; i++) {
        w->seed = w->seed * 1103515245u + 12345u;
        int slot = (int)((w->seed >> 8) % 8);
        if (held[slot]) {
            mt_device_free(w->dev, held[slot]);
            held[slot] = NULL;
            continue;
        }
        size_t bytes = (w->seed >> 12) % (64 * KiB);
        mt_status st = mt_device_alloc(w->dev, bytes, (mt_mem_category)(slot % 6), &held[slot]);
        if (st == MT_ERR_OUT_OF_MEMORY) w->ooms++;
        else if (st != MT_OK) w->failures++;
    }
    for (int slot = 0; slot < 8; slot++) mt_device_free(w->dev, held[slot]);
    return NULL;
}

static void test_threads(void) {
    enum { THREADS = 4 };
    mt_device *dev = NULL;
    /* Small enough that the threads run into the capacity often. */
    CHECK_OK(mt_device_open_cpu(192 * KiB, &dev));
    if (!dev) return;
    pthread_t threads[THREADS];
    worker workers[THREADS];
    for (int t = 0; t < THREADS; t++) {
        workers[t] = (worker){dev, 1000u + (unsigned)t, 0, 0};
        CHECK(pthread_create(&threads[t], NULL, worker_main, &workers[t]) == 0);
    }
    int ooms = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(threads[t], NULL);
        CHECK(workers[t].failures == 0);
        ooms += workers[t].ooms;
    }
    mt_mem_stats s;
    mt_device_mem_stats(dev, &s);
    CHECK_MSG(s.total_current == 0, "%zu bytes still charged after every thread freed all",
              s.total_current);
    CHECK_MSG(s.total_peak <= 192 * KiB, "peak %zu above the capacity", s.total_peak);
    CHECK(s.total_peak > 0);
    CHECK_MSG(ooms > 0, "the capacity was never reached: the test did not test it");
    mt_device_close(dev);
}

/* ---- CUDA, or the fallback to the CPU -------------------------------------------------------- */

static void test_cuda_or_fallback(void) {
    mt_device *dev = NULL;
    capture cap;
    capture_begin(&cap);
    mt_status st = mt_device_open(MT_DEVICE_CUDA, 0, &dev);
    const char *err = capture_end(&cap);
    CHECK_OK(st);
    if (!dev) return;
    if (mt_device_is_fallback(dev)) {
        printf("cuda:0 is not available here: testing the fallback to the CPU device\n");
        CHECK(mt_device_get_kind(dev) == MT_DEVICE_CPU);
        CHECK(strcmp(mt_device_name(dev), "cpu") == 0);
        CHECK_MSG(strstr(err, "no CUDA GPU found (") &&
                      strstr(err, "); falling back to the CPU device"),
                  "notice: %s", err);
        const char *nl = strchr(err, '\n');
        CHECK_MSG(nl && nl[1] == '\0', "the notice is not exactly one line: %s", err);
        test_copy_and_streams(dev);
        mt_device_close(dev);

        /* The fallback device honours MT_CPU_DEVICE_MEMORY like the CPU device. */
        setenv("MT_CPU_DEVICE_MEMORY", "2MiB", 1);
        capture_begin(&cap);
        st = mt_device_open(MT_DEVICE_CUDA, 3, &dev);
        capture_end(&cap);
        CHECK_OK(st);
        if (dev) {
            mt_mem_stats s;
            mt_device_mem_stats(dev, &s);
            CHECK(s.capacity == 2 * MiB);
            CHECK(mt_device_is_fallback(dev));
            mt_device_close(dev);
        }
        setenv("MT_CPU_DEVICE_MEMORY", "lots", 1);
        capture_begin(&cap);
        CHECK(mt_device_open(MT_DEVICE_CUDA, 0, &dev) == MT_ERR_INVALID_ARG);
        capture_end(&cap);
        unsetenv("MT_CPU_DEVICE_MEMORY");
        return;
    }

    printf("testing the GPU device %s\n", mt_device_name(dev));
    CHECK(mt_device_get_kind(dev) == MT_DEVICE_CUDA);
    CHECK(strcmp(mt_device_name(dev), "cuda:0") == 0);
    CHECK(mt_device_index(dev) == 0);
    void *p = NULL;
    CHECK_OK(mt_device_alloc(dev, 3 * MiB, MT_MEM_PARAMS, &p));
    CHECK(((uintptr_t)p % 256) == 0);
    mt_mem_stats s;
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_PARAMS] == 3 * MiB);
    mt_device_free(dev, p);
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_PARAMS] == 0 && s.peak[MT_MEM_PARAMS] == 3 * MiB);
    /* More than any GPU has: an out-of-memory error, not a crash. */
    CHECK(mt_device_alloc(dev, (size_t)1 << 50, MT_MEM_ACTIVATIONS, &p) == MT_ERR_OUT_OF_MEMORY);
    CHECK_MSG(strstr(mt_last_error(), "out of memory on cuda:0") &&
                  strstr(mt_last_error(), "activations"),
              "%s", mt_last_error());
    test_copy_and_streams(dev);
    mt_device_close(dev);

    mt_device *missing = NULL;
    CHECK(mt_device_open(MT_DEVICE_CUDA, 1000, &missing) == MT_ERR_NOT_FOUND);
    CHECK_MSG(strstr(mt_last_error(), "cuda:1000") && strstr(mt_last_error(), "GPU(s)"), "%s",
              mt_last_error());
    CHECK(missing == NULL);
}

int main(void) {
    setenv("MT_LOG_LEVEL", "warn", 1); /* the tests read warnings; keep them on */
    unsetenv("MT_CPU_DEVICE_MEMORY");
    test_accounting();
    test_many_blocks();
    test_out_of_memory();
    test_external_over_capacity();
    test_env_capacity();
    test_bad_free_and_leaks();
    mt_device *cpu = NULL;
    CHECK_OK(mt_device_open_cpu(0, &cpu));
    if (cpu) {
        test_copy_and_streams(cpu);
        mt_device_close(cpu);
    }
    test_threads();
    test_cuda_or_fallback();
    return check_report("test_device");
}
