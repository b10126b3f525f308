/* mt-bench-offload: bandwidth of offload staging copies (include/meshtrain/stage.h) between a
 * host-tier block and device memory, both directions, against the plain copy the same run
 * measures (memcpy on the CPU device, a synchronous mt_device_copy on a GPU).
 *
 *   mt-bench-offload [--min-bytes B] [--max-bytes B] [--total B] [--reps N]
 *
 * Sizes go from --min-bytes (64KiB) to --max-bytes (256MiB) by factors of 4. Each measurement
 * copies one buffer after another, each started with mt_stage_copy_async and waited for with
 * mt_stage_wait (as the offload engine copies a shard), until about --total bytes (1GiB, at least
 * 4 copies) have moved; the best of --reps (3) such runs is printed. One line per size on stdout:
 *   bytes=65536 h2d_gbs=.. d2h_gbs=.. memcpy_gbs=.. path=ucx
 * GB = 1e9 bytes. bench/offload_perftest.sh puts the figures beside ucx_perftest's.
 */
#include <meshtrain/device.h>
#include <meshtrain/host_memory.h>
#include <meshtrain/memory.h>
#include <meshtrain/stage.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROG "mt-bench-offload"

typedef struct options {
    size_t min_bytes, max_bytes, total;
    int reps;
} options;

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.min_bytes = 64u << 10, .max_bytes = 256u << 20, .total = 1u << 30, .reps = 3};
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i];
        size_t *bytes = !strcmp(name, "--min-bytes")   ? &o->min_bytes
                        : !strcmp(name, "--max-bytes") ? &o->max_bytes
                        : !strcmp(name, "--total")     ? &o->total
                                                       : NULL;
        bool ok = i + 1 < argc;
        if (ok && bytes) ok = mt_parse_bytes(argv[++i], bytes) == MT_OK && *bytes > 0;
        else if (ok && !strcmp(name, "--reps")) ok = (o->reps = atoi(argv[++i])) >= 1;
        else ok = false;
        if (!ok) {
            fprintf(stderr, PROG ": bad option %s%s%s (--min-bytes, --max-bytes, --total take a "
                            "byte count > 0 such as 64KiB; --reps an integer >= 1)\n", name,
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
    return 0;
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
