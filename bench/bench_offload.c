/* mt-bench-offload: bandwidth of offload staging copies (include/meshtrain/stage.h) between a
 * host-tier block and device memory, both directions, beside two references measured in the same
 * run on the same memory types: the device's plain asynchronous copy (memcpy on the CPU device,
 * cudaMemcpyAsync on a stream of its own then a synchronize, on a GPU), and ucx_perftest in
 * loopback mode (-l: one process, an endpoint to its own worker, as the stager has) running
 * ucp_get, the operation the stager posts, with -m naming the get's local (destination) then its
 * remote (source) memory: cuda,host for host to device, host,cuda back; host,host on the CPU
 * device.
 *
 *   mt-bench-offload [--min-bytes B] [--max-bytes B] [--total B] [--reps N] [--overlap-bytes B]
 *                    [--perftest PATH | --no-perftest] [--json]
 *
 * The ucx_perftest is the one of the UCX this program loaded: bin/ucx_perftest beside the
 * folder of the libucp.so.0 it runs with (an MT_UCX_ROOT build, e.g. the libucx-cu13 wheel), run
 * with that folder first on LD_LIBRARY_PATH (the wheel's has no run path to it); else the one on
 * PATH when it loads the same libucp.so.0 (ldd), as Debian's does for a Debian build; else none,
 * and the header says why. --perftest names one (run like the one beside). Its MB/s are MiB/s,
 * converted here.
 *
 * Sizes go from --min-bytes (64KiB) to --max-bytes (256MiB) by factors of 4. Each measurement
 * copies one buffer after another, each started with mt_stage_copy_async and waited for with
 * mt_stage_wait (as the offload engine copies a shard), until about --total bytes (1GiB, at least
 * 4 copies) have moved; the best of --reps (3) such runs is printed, GB = 1e9 bytes. Output, like
 * nccl-tests: a header (device, stager path, UCX, ucx_perftest) and one row per size:
 *   #      bytes  stage_h2d  stage_d2h   copy_h2d   copy_d2h   perf_h2d   perf_d2h
 * ("-" where ucx_perftest was not run or failed). With --json one object per line instead:
 *   {"bytes": 65536, "path": "ucx", "copy": "memcpy", "stage_h2d_gbs": .., "stage_d2h_gbs": ..,
 *    "copy_h2d_gbs": .., "copy_d2h_gbs": .., "perftest_h2d_gbs": .. or null,
 *    "perftest_d2h_gbs": .., "perftest_mem_h2d": "cuda,host", "perftest_mem_d2h": "host,cuda"}
 *
 * Then, unless --overlap-bytes is 0 (default 64MiB, at most --max-bytes), whether a copy runs
 * while the caller computes, as offloading needs (the next unit's shard arrives during this
 * unit's compute): the time of one host-to-device copy alone, of a compute loop calibrated to
 * take about as long (arithmetic on an array that stays in L1, so it competes for a core, not
 * for memory bandwidth), and of both (start the copy, compute, wait). hidden = (copy + compute -
 * both) / min(copy, compute): 1 when the copy is entirely hidden, 0 when they ran one after the
 * other; start_ms is how long starting the copy held the caller. The same hidden figure for two
 * references without UCX that memcpy the same bytes: a thread started per copy, and a persistent
 * worker woken through a condition variable like the staging thread. Best of --reps, one line
 * (with --json an object with "test": "overlap" and these keys):
 *   overlap bytes=67108864 copy_ms=.. compute_ms=.. both_ms=.. hidden=.. start_ms=..
 *           fresh_thread_hidden=.. worker_hidden=..
 */
#include <meshtrain/device.h>
#include <meshtrain/host_memory.h>
#include <meshtrain/memory.h>
#include <meshtrain/stage.h>

#include <dlfcn.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define PROG "mt-bench-offload"

typedef struct options {
    size_t min_bytes, max_bytes, total, overlap_bytes;
    int reps;
    bool json, no_perftest;
    const char *perftest; /* NULL: the loaded UCX's */
} options;

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.min_bytes = 64u << 10, .max_bytes = 256u << 20, .total = 1u << 30, .reps = 3,
                   .overlap_bytes = 64u << 20};
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i];
        if (!strcmp(name, "--json") || !strcmp(name, "--no-perftest")) {
            *(name[2] == 'j' ? &o->json : &o->no_perftest) = true;
            continue;
        }
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
        else if (ok && !strcmp(name, "--perftest")) ok = *(o->perftest = argv[++i]) != 0;
        else ok = false;
        if (!ok) {
            fprintf(stderr, PROG ": bad option %s%s%s (--min-bytes, --max-bytes, --total take a "
                            "byte count > 0 such as 64KiB, --overlap-bytes one >= 0; --reps an "
                            "integer >= 1; --perftest a path; --json and --no-perftest no "
                            "value)\n", name,
                    argv[i] != name ? " " : "", argv[i] != name ? argv[i] : "");
            return -1;
        }
    }
    if (o->min_bytes > o->max_bytes) {
        fprintf(stderr, PROG ": --min-bytes is larger than --max-bytes\n");
        return -1;
    }
    if (o->perftest && o->no_perftest) {
        fprintf(stderr, PROG ": --perftest and --no-perftest exclude each other\n");
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
    mt_stream *stream; /* the plain copy's, on a GPU */
    unsigned char *host, *device;
} ctx;

enum { PLAIN = 0x100 }; /* or'ed into a copy kind: the device's plain copy, not the stager */

static mt_status copy_once(ctx *c, size_t bytes, int kind) {
    bool h2d = (kind & ~PLAIN) == MT_COPY_HOST_TO_DEVICE;
    void *dst = h2d ? (void *)c->device : c->host;
    const void *src = h2d ? (void *)c->host : c->device;
    if (kind & PLAIN) {
        if (mt_device_get_kind(c->dev) == MT_DEVICE_CPU) {
            memcpy(dst, src, bytes);
            return MT_OK;
        }
        /* cudaMemcpyAsync on the stream, waited for like a staged copy. */
        mt_status s = mt_device_copy(c->dev, dst, src, bytes, (mt_copy_kind)(kind & ~PLAIN),
                                     c->stream);
        return s == MT_OK ? mt_stream_synchronize(c->stream) : s;
    }
    mt_stage_copy *h = NULL;
    mt_status s = mt_stage_copy_async(c->st, dst, src, bytes, (mt_copy_kind)kind, &h);
    return s == MT_OK ? mt_stage_wait(h) : s;
}

/* Returns GB/s, or -1 after printing the error. */
static double measure(ctx *c, size_t bytes, int copies, int kind) {
    double t0 = now_s();
    for (int i = 0; i < copies; i++) {
        if (copy_once(c, bytes, kind) != MT_OK) {
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

/* ---- ucx_perftest ------------------------------------------------------------------------------ */

typedef struct perftest {
    char path[4096];   /* the program; empty: none */
    char libdir[4096]; /* the folder of the libucp.so.0 this program loaded */
    char ucp[4096];    /* that libucp.so.0, resolved */
    bool with_libdir;  /* run with libdir first on LD_LIBRARY_PATH */
    char why[4200];    /* why there is none */
} perftest;

static bool executable(const char *path) { return access(path, X_OK) == 0; }

/* Whether the program at path loads the libucp.so.0 this program loaded (ldd's answer). */
static bool loads_our_ucp(const perftest *p, const char *path, char *theirs, size_t cap) {
    snprintf(theirs, cap, "?");
    if (strchr(path, '\'')) return false;
    char cmd[4200], line[4600], lib[4096];
    snprintf(cmd, sizeof cmd, "ldd '%s' 2>/dev/null", path);
    FILE *f = popen(cmd, "r");
    if (!f) return false;
    bool same = false;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, " libucp.so.0 => %4095s", lib) == 1) {
            char *real = realpath(lib, NULL);
            snprintf(theirs, cap, "%s", real ? real : lib);
            same = real && !strcmp(real, p->ucp);
            free(real);
        }
    pclose(f);
    return same;
}

/* The ucx_perftest of the UCX loaded here (see the top of the file). A ucx_perftest of another
 * UCX version run on this libucp crashes (their structs differ), and one that loads another
 * libucp measures another UCX: neither is used. */
static void find_perftest(const options *o, perftest *p) {
    memset(p, 0, sizeof *p);
    Dl_info info;
    if (dladdr((void *)ucp_get_version_string, &info) && info.dli_fname) {
        char *real = realpath(info.dli_fname, NULL);
        snprintf(p->ucp, sizeof p->ucp, "%s", real ? real : info.dli_fname);
        free(real);
        snprintf(p->libdir, sizeof p->libdir, "%s", info.dli_fname);
        char *slash = strrchr(p->libdir, '/');
        if (slash) *slash = 0;
        else p->libdir[0] = 0;
    }
    if (o->no_perftest) {
        snprintf(p->why, sizeof p->why, "--no-perftest");
        return;
    }
    if (o->perftest) {
        snprintf(p->path, sizeof p->path, "%s", o->perftest);
        p->with_libdir = true;
        return;
    }
    char beside[4200];
    snprintf(beside, sizeof beside, "%s/../bin/ucx_perftest", p->libdir);
    char *real = p->libdir[0] && executable(beside) ? realpath(beside, NULL) : NULL;
    if (real) {
        snprintf(p->path, sizeof p->path, "%s", real);
        p->with_libdir = true; /* the wheel's has no run path to its lib/ */
        free(real);
        return;
    }
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t n = strcspn(path, ":");
        char cand[4200], theirs[4096];
        snprintf(cand, sizeof cand, "%.*s/ucx_perftest", (int)n, path);
        if (n && executable(cand)) {
            if (loads_our_ucp(p, cand, theirs, sizeof theirs))
                snprintf(p->path, sizeof p->path, "%s", cand);
            else
                snprintf(p->why, sizeof p->why, "%s loads %s, not this program's UCX", cand,
                         theirs);
            return;
        }
        path += n + (path[n] == ':');
    }
    snprintf(p->why, sizeof p->why, "none beside %s nor on PATH", p->libdir);
}

/* ucx_perftest -l -t ucp_get -m mem (local,remote) on bytes, iters times; the "Final:" line's
 * average bandwidth in GB/s, best of reps, or -1 when it fails (said on stderr once per size). */
static double perftest_gbs(const perftest *p, const char *mem, size_t bytes, long iters,
                           int reps) {
    if (!p->path[0] || strchr(p->path, '\'') || strchr(p->libdir, '\'')) return -1;
    char cmd[9000], env[4200] = "";
    if (p->with_libdir)
        snprintf(env, sizeof env, "env LD_LIBRARY_PATH='%s'${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ",
                 p->libdir);
    snprintf(cmd, sizeof cmd, "%s'%s' -l -t ucp_get -m %s -s %zu -n %ld 2>&1", env, p->path, mem,
             bytes, iters);
    double top = -1;
    for (int r = 0; r < reps; r++) {
        FILE *f = popen(cmd, "r");
        if (!f) break;
        char line[1024], last[1024] = "";
        double mib_s = -1;
        while (fgets(line, sizeof line, f)) {
            double v[6];
            long n;
            if (sscanf(line, "Final: %ld %lf %lf %lf %lf %lf %lf", &n, &v[0], &v[1], &v[2], &v[3],
                       &v[4], &v[5]) == 7)
                mib_s = v[3]; /* average bandwidth, "MB/s" meaning MiB/s */
            else if (line[0] != '|' && line[0] != '+' && line[0] != '\n')
                snprintf(last, sizeof last, "%s", line);
        }
        int rc = pclose(f);
        if (rc != 0 || mib_s < 0) {
            fprintf(stderr, PROG ": %s -m %s on %zu bytes failed (status %d): %s", p->path, mem,
                    bytes, rc, last[0] ? last : "no Final: line\n");
            return -1;
        }
        double gbs = mib_s * 1048576.0 / 1e9;
        if (gbs > top) top = gbs;
    }
    return top;
}

/* ---- output ------------------------------------------------------------------------------------ */

static void print_header(ctx *c, const perftest *p, const char *path, const char *plain) {
    char name[64];
    snprintf(name, sizeof name, "%s", mt_device_get_kind(c->dev) == MT_DEVICE_CPU ? "cpu" : "cuda");
    printf("# " PROG ": device %s, stager path %s, UCX %s (%s)\n", name, path,
           ucp_get_version_string(), p->ucp[0] ? p->ucp : "?");
    printf("# stage: mt_stage_copy_async + mt_stage_wait; copy: %s; perf: %s%s%s\n", plain,
           p->path[0] ? p->path : "(no ucx_perftest: ", p->path[0] ? "" : p->why,
           p->path[0] ? "" : ")");
    printf("# GB/s (1e9 bytes/s), best of the runs; perf = ucx_perftest -l -t ucp_get -m %s "
           "(h2d) / %s (d2h)\n", mt_device_get_kind(c->dev) == MT_DEVICE_CPU ? "host,host" :
           "cuda,host", mt_device_get_kind(c->dev) == MT_DEVICE_CPU ? "host,host" : "host,cuda");
    printf("#%11s %10s %10s %10s %10s %10s %10s\n", "bytes", "stage_h2d", "stage_d2h",
           "copy_h2d", "copy_d2h", "perf_h2d", "perf_d2h");
}

static void cell(double gbs) {
    if (gbs < 0) printf(" %10s", "-");
    else printf(" %10.3f", gbs);
}

static json_t *gbs_or_null(double gbs) { return gbs < 0 ? json_null() : json_real(gbs); }

static void print_json(json_t *obj) {
    char *text = json_dumps(obj, JSON_COMPACT | JSON_REAL_PRECISION(6));
    json_decref(obj);
    if (text) printf("%s\n", text);
    free(text);
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

static int measure_overlap(ctx *c, size_t bytes, int reps, bool json) {
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
    double h = hidden(best[0], best[1], best[2]), fresh = hidden(tbest[0], best[1], tbest[1]),
           kept = hidden(tbest[2], best[1], tbest[3]);
    if (json) {
        print_json(json_pack("{s:s, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "test", "overlap",
                             "bytes", (json_int_t)bytes, "copy_ms", best[0], "compute_ms",
                             best[1], "both_ms", best[2], "hidden", h, "start_ms", best_start,
                             "fresh_thread_hidden", fresh, "worker_hidden", kept));
        return 0;
    }
    printf("overlap bytes=%zu copy_ms=%.3f compute_ms=%.3f both_ms=%.3f hidden=%.2f "
           "start_ms=%.4f fresh_thread_hidden=%.2f worker_hidden=%.2f\n", bytes, best[0], best[1],
           best[2], h, best_start, fresh, kept);
    return 0;
}

static int run(ctx *c, const options *o) {
    bool cpu = mt_device_get_kind(c->dev) == MT_DEVICE_CPU;
    if (mt_stager_create(c->dev, &c->st) != MT_OK ||
        (!cpu && mt_stream_create(c->dev, &c->stream) != MT_OK) ||
        mt_host_tier_alloc(c->dev, o->max_bytes, MT_MEM_PARAMS, (void **)&c->host) != MT_OK ||
        mt_device_alloc(c->dev, o->max_bytes, MT_MEM_PARAMS, (void **)&c->device) != MT_OK ||
        mt_stager_register(c->st, c->host, o->max_bytes) != MT_OK ||
        mt_stager_register(c->st, c->device, o->max_bytes) != MT_OK) {
        fprintf(stderr, PROG ": setting up: %s\n", mt_last_error());
        return 1;
    }
    memset(c->host, 1, o->max_bytes);
    const char *path = mt_stage_path_name(mt_stager_path(c->st));
    const char *plain = cpu ? "memcpy" : "cudaMemcpyAsync";
    const char *mem_h2d = cpu ? "host,host" : "cuda,host", *mem_d2h = cpu ? "host,host" : "host,cuda";
    perftest p;
    find_perftest(o, &p);
    if (!o->json) print_header(c, &p, path, plain);
    fflush(stdout);
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= 4) {
        size_t n = o->total / bytes;
        int copies = n < 4 ? 4 : n > 1000000 ? 1000000 : (int)n;
        double g[6] = {
            best(c, bytes, copies, MT_COPY_HOST_TO_DEVICE, o->reps),
            best(c, bytes, copies, MT_COPY_DEVICE_TO_HOST, o->reps),
            best(c, bytes, copies, PLAIN | MT_COPY_HOST_TO_DEVICE, o->reps),
            best(c, bytes, copies, PLAIN | MT_COPY_DEVICE_TO_HOST, o->reps),
        };
        for (int k = 0; k < 4; k++)
            if (g[k] < 0) return 1;
        g[4] = perftest_gbs(&p, mem_h2d, bytes, copies, o->reps);
        /* On the CPU device both directions are the same host,host test. */
        g[5] = cpu ? g[4] : perftest_gbs(&p, mem_d2h, bytes, copies, o->reps);
        if (o->json) {
            print_json(json_pack("{s:I, s:s, s:s, s:f, s:f, s:f, s:f, s:o, s:o, s:s, s:s}",
                                 "bytes", (json_int_t)bytes, "path", path, "copy", plain,
                                 "stage_h2d_gbs", g[0], "stage_d2h_gbs", g[1], "copy_h2d_gbs",
                                 g[2], "copy_d2h_gbs", g[3], "perftest_h2d_gbs",
                                 gbs_or_null(g[4]), "perftest_d2h_gbs", gbs_or_null(g[5]),
                                 "perftest_mem_h2d", mem_h2d, "perftest_mem_d2h", mem_d2h));
        } else {
            printf(" %11zu", bytes);
            for (int k = 0; k < 6; k++) cell(g[k]);
            printf("\n");
        }
        fflush(stdout);
        if (bytes > o->max_bytes / 4) break;
    }
    if (!o->overlap_bytes) return 0;
    return measure_overlap(c, o->overlap_bytes < o->max_bytes ? o->overlap_bytes : o->max_bytes,
                           o->reps, o->json);
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
    if (c.stream) mt_stream_destroy(c.stream);
    mt_host_tier_free(c.dev, c.host);
    mt_device_free(c.dev, c.device);
    mt_device_close(c.dev);
    return rc;
}
