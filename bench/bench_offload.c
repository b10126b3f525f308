/* mt-bench-offload: bandwidth of offload staging copies (include/meshtrain/stage.h) between a
 * host-tier block and device memory, both directions, against the plain copy the same run
 * measures (memcpy on the CPU device, a synchronous mt_device_copy on a GPU).
 *
 *   mt-bench-offload [--min-bytes B] [--max-bytes B] [--total B] [--reps N] [--overlap-bytes B]
 *
 * Sizes go from --min-bytes (64KiB) to --max-bytes (256MiB) by factors of 4. Each measurement
 * copies one buffer after another, each started with mt_stage_copy_async and waited for with
 * mt_stage_wait (as the offload engine copies a shard), until about --total bytes (1GiB, at least
 * 4 copies) have moved; the best of --reps (3) such runs is printed. One line per size on stdout:
 *   bytes=65536 h2d_gbs=.. d2h_gbs=.. memcpy_gbs=.. path=ucx
 * GB = 1e9 bytes. bench/offload_perftest.sh puts the figures beside ucx_perftest's.
 *
 * Then, unless --overlap-bytes is 0 (default 64MiB, at most --max-bytes), whether a copy runs
 * while the caller computes, as offloading needs (the next unit's shard arrives during this
 * unit's compute): the time of one host-to-device copy alone, of a compute loop calibrated to
 * take about as long (arithmetic on an array that stays in L1, so it competes for a core, not
 * for memory bandwidth), and of both (start the copy, compute, wait). hidden = (copy + compute -
 * both) / min(copy, compute): 1 when the copy is entirely hidden, 0 when they ran one after the
 * other; start_ms is how long starting the copy held the caller. The same hidden figure for two
 * references without UCX that memcpy the same bytes: a thread started per copy, and a persistent
 * worker woken through a condition variable like the staging thread. Best of --reps, one line:
 *   overlap bytes=67108864 copy_ms=.. compute_ms=.. both_ms=.. hidden=.. start_ms=..
 *           fresh_thread_hidden=.. worker_hidden=..
 */
#include <meshtrain/device.h>
#include <meshtrain/host_memory.h>
#include <meshtrain/memory.h>
#include <meshtrain/stage.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROG "mt-bench-offload"

typedef struct options {
    size_t min_bytes, max_bytes, total, overlap_bytes;
    int reps;
} options;

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.min_bytes = 64u << 10, .max_bytes = 256u << 20, .total = 1u << 30, .reps = 3,
                   .overlap_bytes = 64u << 20};
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i];
        size_t *bytes = !strcmp(name, "--min-bytes")       ? &o->min_bytes
                        : !strcmp(name, "--max-bytes")     ? &o->max_bytes
                        : !strcmp(name, "--total")         ? &o->total
                        : !strcmp(name, "--overlap-bytes") ? &o->overlap_bytes
                                                           : NULL;
        bool ok = i + 1 < argc;
        if (ok && bytes)
            ok = mt_parse_bytes(argv[++i], bytes) == MT_OK &&
                 (*bytes > 0 || bytes == &o->overlap_bytes);
        else if (ok && !strcmp(name, "--reps")) ok = (o->reps = atoi(argv[++i])) >= 1;
        else ok = false;
        if (!ok) {
            fprintf(stderr, PROG ": bad option %s%s%s (--min-bytes, --max-bytes, --total take a "
                            "byte count > 0 such as 64KiB, --overlap-bytes one >= 0; --reps an integer >= 1)\n", name,
                    argv[i] != name ? " " : "", argv[i] != name ? argv[i] : "");
            return -1;
        }
    }
    if (o->min_bytes > o->max_bytes) {
        fprintf(stderr, PROG ": --min-bytes is larger than --max-bytes\n");
        return -1;
    }
    return 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct ctx {
    mt_device *dev;
    mt_stager *st;
    unsigned char *host, *device;
} ctx;

/* kind < 0: the plain copy, host to device. Returns GB/s, or -1 after printing the error. */
static double measure(ctx *c, size_t bytes, int copies, int kind) {
    double t0 = now_s();
    for (int i = 0; i < copies; i++) {
        mt_status s = MT_OK;
        if (kind < 0 && mt_device_get_kind(c->dev) == MT_DEVICE_CPU) {
            memcpy(c->device, c->host, bytes);
        } else if (kind < 0) {
            s = mt_device_copy(c->dev, c->device, c->host, bytes, MT_COPY_HOST_TO_DEVICE, NULL);
        } else {
            mt_stage_copy *h = NULL;
            bool h2d = kind == MT_COPY_HOST_TO_DEVICE;
            s = mt_stage_copy_async(c->st, h2d ? (void *)c->device : c->host,
                                    h2d ? (void *)c->host : c->device, bytes, (mt_copy_kind)kind,
                                    &h);
            if (s == MT_OK) s = mt_stage_wait(h);
        }
        if (s != MT_OK) {
            fprintf(stderr, PROG ": copy of %zu bytes failed: %s\n", bytes, mt_last_error());
            return -1;
        }
    }
    double secs = now_s() - t0;
    return (double)bytes * copies / secs / 1e9;
}

static double best(ctx *c, size_t bytes, int copies, int kind, int reps) {
    double top = 0;
    (void)measure(c, bytes, 1, kind); /* first touch and warm-up */
    for (int r = 0; r < reps; r++) {
        double gbs = measure(c, bytes, copies, kind);
        if (gbs < 0) return -1;
        if (gbs > top) top = gbs;
    }
    return top;
}

/* Arithmetic on 1024 floats (4 KiB, stays in L1), rounds times; the sum keeps it from being
 * optimised away. */
static float compute(long rounds) {
    static float a[1024];
    float sum = 0;
    for (long r = 0; r < rounds; r++)
        for (int i = 0; i < 1024; i++) {
            a[i] = a[i] * 0.999f + 1.0f;
            sum += a[i];
        }
    return sum;
}

static volatile float sink;

/* One overlap measurement (milliseconds): copy alone, compute alone, both; *start_ms: how long
 * starting the copy kept the caller in the "both" case. */
static int overlap_once(ctx *c, size_t bytes, long rounds, double ms[3], double *start_ms) {
    for (int k = 0; k < 3; k++) {
        double t0 = now_s();
        mt_stage_copy *h = NULL;
        mt_status s = MT_OK;
        if (k != 1)
            s = mt_stage_copy_async(c->st, c->device, c->host, bytes, MT_COPY_HOST_TO_DEVICE, &h);
        if (k == 2) *start_ms = (now_s() - t0) * 1e3;
        if (s == MT_OK && k != 0) sink = compute(rounds);
        if (s == MT_OK && h) s = mt_stage_wait(h);
        if (s != MT_OK) {
            fprintf(stderr, PROG ": overlap copy of %zu bytes failed: %s\n", bytes,
                    mt_last_error());
            return -1;
        }
        ms[k] = (now_s() - t0) * 1e3;
    }
    return 0;
}

/* References for the stager's overlap, without UCX: a thread started for each copy (placed on
 * the least loaded CPU, as new threads are) and a persistent worker woken through a condition
 * variable, as the staging thread is (a woken thread may be queued behind its waker). */
typedef struct plain_worker {
    void *dst;
    const void *src;
    size_t bytes;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int job; /* 1: copy, -1: leave */
    bool done;
} plain_worker;

static void *fresh_copy(void *arg) {
    plain_worker *w = arg;
    memcpy(w->dst, w->src, w->bytes);
    return NULL;
}

static void *persistent_copy(void *arg) {
    plain_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->job) pthread_cond_wait(&w->cv, &w->mu);
        if (w->job < 0) break;
        w->job = 0;
        pthread_mutex_unlock(&w->mu);
        memcpy(w->dst, w->src, w->bytes);
        pthread_mutex_lock(&w->mu);
        w->done = true;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void worker_post(plain_worker *w, int job) {
    pthread_mutex_lock(&w->mu);
    w->job = job;
    w->done = false;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* ms[0..1]: fresh thread copy alone, with compute; ms[2..3]: the persistent worker's. */
static int reference_overlap_once(plain_worker *w, long rounds, double ms[4]) {
    for (int k = 0; k < 4; k++) {
        double t0 = now_s();
        pthread_t thread;
        if (k < 2 && pthread_create(&thread, NULL, fresh_copy, w) != 0) {
            fprintf(stderr, PROG ": cannot start a copy thread\n");
            return -1;
        }
        if (k >= 2) worker_post(w, 1);
        if (k % 2) sink = compute(rounds);
        if (k < 2) {
            pthread_join(thread, NULL);
        } else {
            pthread_mutex_lock(&w->mu);
            while (!w->done) pthread_cond_wait(&w->cv, &w->mu);
            pthread_mutex_unlock(&w->mu);
        }
        ms[k] = (now_s() - t0) * 1e3;
    }
    return 0;
}

/* (alone + compute - both) / min(alone, compute). */
static double hidden(double alone, double compute_ms, double both) {
    return (alone + compute_ms - both) / (alone < compute_ms ? alone : compute_ms);
}

static int measure_overlap(ctx *c, size_t bytes, int reps) {
    double ms[3], best[3] = {1e30, 1e30, 1e30}, start = 0, best_start = 1e30;
    double tms[4], tbest[4] = {1e30, 1e30, 1e30, 1e30};
    plain_worker w = {.dst = c->device, .src = c->host, .bytes = bytes,
                      .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    pthread_t worker;
    if (pthread_create(&worker, NULL, persistent_copy, &w) != 0) {
        fprintf(stderr, PROG ": cannot start a copy thread\n");
        return 1;
    }
    int rc = 0;
    /* The copy's best time first, then a compute loop calibrated to it. */
    for (int r = 0; r < reps && rc == 0; r++) {
        rc = overlap_once(c, bytes, 1, ms, &start);
        if (ms[0] < best[0]) best[0] = ms[0];
    }
    double t0 = now_s();
    sink = compute(1000);
    double per_round_ms = (now_s() - t0) * 1e3 / 1000;
    long rounds = (long)(best[0] / (per_round_ms > 0 ? per_round_ms : 1e-6));
    if (rounds < 1) rounds = 1;
    for (int r = 0; r < reps && rc == 0; r++) {
        rc = overlap_once(c, bytes, rounds, ms, &start);
        if (rc == 0) rc = reference_overlap_once(&w, rounds, tms);
        if (rc) break;
        for (int k = 0; k < 3; k++)
            if (ms[k] < best[k]) best[k] = ms[k];
        if (start < best_start) best_start = start;
        for (int k = 0; k < 4; k++)
            if (tms[k] < tbest[k]) tbest[k] = tms[k];
    }
    worker_post(&w, -1);
    pthread_join(worker, NULL);
    if (rc) return 1;
    printf("overlap bytes=%zu copy_ms=%.3f compute_ms=%.3f both_ms=%.3f hidden=%.2f "
           "start_ms=%.4f fresh_thread_hidden=%.2f worker_hidden=%.2f\n", bytes, best[0], best[1],
           best[2], hidden(best[0], best[1], best[2]), best_start,
           hidden(tbest[0], best[1], tbest[1]), hidden(tbest[2], best[1], tbest[3]));
    return 0;
}

static int run(ctx *c, const options *o) {
    if (mt_stager_create(c->dev, &c->st) != MT_OK ||
        mt_host_tier_alloc(c->dev, o->max_bytes, MT_MEM_PARAMS, (void **)&c->host) != MT_OK ||
        mt_device_alloc(c->dev, o->max_bytes, MT_MEM_PARAMS, (void **)&c->device) != MT_OK ||
        mt_stager_register(c->st, c->host, o->max_bytes) != MT_OK ||
        mt_stager_register(c->st, c->device, o->max_bytes) != MT_OK) {
        fprintf(stderr, PROG ": setting up: %s\n", mt_last_error());
        return 1;
    }
    memset(c->host, 1, o->max_bytes);
    const char *path = mt_stage_path_name(mt_stager_path(c->st));
    const char *plain = mt_device_get_kind(c->dev) == MT_DEVICE_CPU ? "memcpy" : "device_copy";
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= 4) {
        size_t n = o->total / bytes;
        int copies = n < 4 ? 4 : n > 1000000 ? 1000000 : (int)n;
        double h2d = best(c, bytes, copies, MT_COPY_HOST_TO_DEVICE, o->reps);
        double d2h = best(c, bytes, copies, MT_COPY_DEVICE_TO_HOST, o->reps);
        double base = best(c, bytes, copies, -1, o->reps);
        if (h2d < 0 || d2h < 0 || base < 0) return 1;
        printf("bytes=%zu h2d_gbs=%.3f d2h_gbs=%.3f %s_gbs=%.3f path=%s\n", bytes, h2d, d2h,
               plain, base, path);
        fflush(stdout);
        if (bytes > o->max_bytes / 4) break;
    }
    if (!o->overlap_bytes) return 0;
    return measure_overlap(c, o->overlap_bytes < o->max_bytes ? o->overlap_bytes : o->max_bytes,
                           o->reps);
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o) != 0) return 2;
    const char *want = getenv("MT_DEVICE");
    mt_device_kind kind = want && !strcmp(want, "cpu") ? MT_DEVICE_CPU : MT_DEVICE_CUDA;
    ctx c = {0};
    if (mt_device_open(kind, 0, &c.dev) != MT_OK) {
        fprintf(stderr, PROG ": %s\n", mt_last_error());
        return 1;
    }
    int rc = run(&c, &o);
    if (c.st) {
        if (c.host) (void)mt_stager_unregister(c.st, c.host);
        if (c.device) (void)mt_stager_unregister(c.st, c.device);
        mt_stager_destroy(c.st);
    }
    mt_host_tier_free(c.dev, c.host);
    mt_device_free(c.dev, c.device);
    mt_device_close(c.dev);
    return rc;
}
