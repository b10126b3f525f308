/* mt-bench-comm: host collective bandwidth, reported like nccl-tests.
 *
 *   mtrun --nproc_per_node N mt-bench-comm [--op all_gather|reduce_scatter|all_reduce|all]
 *         [--min-bytes B] [--max-bytes B] [--dtype f32|bf16] [--iters I] [--warmup W] [--json]
 *
 * size is the total buffer (the gathered output, the scattered input, the all-reduced buffer);
 * sizes double from --min-bytes to --max-bytes (KiB, MiB, GiB suffixes as in mt_parse_bytes). time is the mean over
 * iterations, the slowest rank's. algbw = size / time, busbw = algbw x (n-1)/n for all_gather and
 * reduce_scatter and x 2(n-1)/n for all_reduce; GB = 1e9 bytes. Rank 0 prints; with --json one
 * object per line and nothing else on stdout.
 */
#include <meshtrain/meshtrain.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { OP_AG, OP_RS, OP_AR, OP_COUNT } bench_op;
static const char *op_names[OP_COUNT] = {"all_gather", "reduce_scatter", "all_reduce"};

typedef struct bench_options {
    size_t min_bytes, max_bytes;
    int iters, warmup, json;
    bool ops[OP_COUNT];
    mt_dtype dtype;
} bench_options;

static int parse_count(const char *flag, const char *text, int min, int *out) {
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || *end || v < min || v > 1000000) {
        fprintf(stderr, "mt-bench-comm: %s %s: expected an integer >= %d\n", flag, text, min);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_size(const char *flag, const char *text, size_t *out) {
    if (mt_parse_bytes(text, out) != MT_OK || *out == 0) {
        fprintf(stderr, "mt-bench-comm: %s %s: %s\n", flag, text,
                *mt_last_error() ? mt_last_error() : "must be at least 1 byte");
        return -1;
    }
    return 0;
}

static int parse_op(const char *text, bool ops[OP_COUNT]) {
    bool all = !strcmp(text, "all");
    int matched = 0;
    for (int o = 0; o < OP_COUNT; o++) {
        ops[o] = all || !strcmp(text, op_names[o]);
        matched += ops[o];
    }
    if (matched) return 0;
    fprintf(stderr, "mt-bench-comm: unknown --op %s (all_gather, reduce_scatter, all_reduce or "
                    "all)\n", text);
    return -1;
}

/* Returns 0, or -1 after printing what is wrong. */
static int parse_options(int argc, char **argv, bench_options *o) {
    *o = (bench_options){.min_bytes = 1024, .max_bytes = 256u << 20, .iters = 20, .warmup = 5,
                         .ops = {true, true, true}, .dtype = MT_F32};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        int bad = !v;
        if (bad) fprintf(stderr, "mt-bench-comm: %s needs a value\n", a);
        else if (!strcmp(a, "--op")) bad = parse_op(v, o->ops);
        else if (!strcmp(a, "--min-bytes")) bad = parse_size(a, v, &o->min_bytes);
        else if (!strcmp(a, "--max-bytes")) bad = parse_size(a, v, &o->max_bytes);
        else if (!strcmp(a, "--iters")) bad = parse_count(a, v, 1, &o->iters);
        else if (!strcmp(a, "--warmup")) bad = parse_count(a, v, 0, &o->warmup);
        else if (!strcmp(a, "--dtype")) {
            bad = mt_dtype_parse(v, &o->dtype) != MT_OK;
            if (bad) fprintf(stderr, "mt-bench-comm: %s\n", mt_last_error());
        } else {
            fprintf(stderr, "mt-bench-comm: unknown option %s\n", a);
            bad = 1;
        }
        if (bad) return -1;
    }
    if (o->min_bytes > o->max_bytes) {
        fprintf(stderr, "mt-bench-comm: --min-bytes %zu is above --max-bytes %zu\n", o->min_bytes,
                o->max_bytes);
        return -1;
    }
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static mt_status run_op(mt_group *g, bench_op op, void *in, void *out, size_t count,
                        mt_dtype dt) {
    switch (op) {
    case OP_AG: return mt_all_gather(g, in, out, count, dt, NULL);
    case OP_RS: return mt_reduce_scatter(g, in, out, count, dt, MT_REDUCE_SUM, NULL);
    default: return mt_all_reduce(g, in, out, count, dt, MT_REDUCE_SUM, NULL);
    }
}

static void usage(void) {
    fprintf(stderr, "usage: mt-bench-comm [--op all_gather|reduce_scatter|all_reduce|all] "
                    "[--min-bytes B] [--max-bytes B] [--dtype f32|bf16] [--iters I] "
                    "[--warmup W] [--json]\n");
}

int main(int argc, char **argv) {
    bench_options opt;
    if (parse_options(argc, argv, &opt) != 0) {
        usage();
        return 2;
    }
    size_t min_bytes = opt.min_bytes, max_bytes = opt.max_bytes;
    int iters = opt.iters, warmup = opt.warmup, json = opt.json;
    const bool *ops = opt.ops;
    mt_dtype dt = opt.dtype;
    mt_runtime *rt;
    if (mt_init(&rt, &argc, &argv) != MT_OK) {
        fprintf(stderr, "mt-bench-comm: %s\n", mt_last_error());
        return 1;
    }
    mt_group *world = mt_runtime_world(rt);
    int n = mt_group_size(world), me = mt_group_rank(world);
    size_t es = mt_dtype_size(dt);
    /* The buffers come from the rank's device, as a training step's would (comm category). */
    mt_device *dev = mt_runtime_device(rt);
    size_t cap = max_bytes / es * es + es;
    char *in = NULL, *out = NULL;
    if (mt_device_alloc(dev, cap, MT_MEM_COMM, (void **)&in) != MT_OK ||
        mt_device_alloc(dev, cap, MT_MEM_COMM, (void **)&out) != MT_OK) {
        fprintf(stderr, "mt-bench-comm: %s\n", mt_last_error());
        mt_finalize(rt);
        return 1;
    }
    /* Write every page: an untouched buffer maps the kernel's shared zero page, which reads
     * from cache and would flatter every send. Small values keep sums finite. */
    for (size_t i = 0; i < cap / es; i++) {
        float v = (float)((i + (size_t)me) % 7);
        if (dt == MT_F32) ((float *)in)[i] = v;
        else ((mt_bf16 *)in)[i] = mt_f32_to_bf16(v);
    }
    memset(out, 0, cap);
    if (me == 0 && !json)
        printf("# mt-bench-comm: %d ranks, dtype %s, %d iterations (%d warm-up)\n"
               "# %-15s %12s %12s %12s %10s %10s\n", n, mt_dtype_name(dt), iters, warmup, "op",
               "size(B)", "count", "time(us)", "algbw", "busbw");
    int rc = 0;
    for (int o = 0; o < OP_COUNT && rc == 0; o++) {
        if (!ops[o]) continue;
        for (size_t size = min_bytes; size <= max_bytes && rc == 0; size *= 2) {
            size_t total = size / es;                  /* elements of the total buffer */
            size_t count = o == OP_AR ? total : total / (size_t)n; /* the call's count */
            if (count == 0) continue;
            size_t bytes = (o == OP_AR ? count : count * (size_t)n) * es;
            for (int i = 0; i < warmup && rc == 0; i++)
                if (run_op(world, (bench_op)o, in, out, count, dt) != MT_OK) rc = 1;
            /* Timed pass: a barrier, then iters back-to-back operations. */
            if (rc == 0 && mt_barrier(world, NULL) != MT_OK) rc = 1;
            double t0 = now();
            for (int i = 0; i < iters && rc == 0; i++)
                if (run_op(world, (bench_op)o, in, out, count, dt) != MT_OK) rc = 1;
            float us = (float)((now() - t0) / iters * 1e6), slowest = us;
            if (rc == 0 &&
                mt_all_reduce(world, &us, &slowest, 1, MT_F32, MT_REDUCE_MAX, NULL) != MT_OK)
                rc = 1;
            if (rc != 0) {
                fprintf(stderr, "mt-bench-comm: %s of %zu bytes failed: %s\n", op_names[o], bytes,
                        mt_last_error());
                break;
            }
            double algbw = (double)bytes / ((double)slowest * 1e-6) / 1e9;
            double factor = o == OP_AR ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
            double busbw = algbw * factor;
            if (me != 0) continue;
            if (json)
                printf("{\"op\":\"%s\",\"bytes\":%zu,\"count\":%zu,\"dtype\":\"%s\",\"ranks\":%d,"
                       "\"time_us\":%.2f,\"algbw_gbs\":%.4f,\"busbw_gbs\":%.4f}\n",
                       op_names[o], bytes, bytes / es, mt_dtype_name(dt), n, (double)slowest,
                       algbw, busbw);
            else
                printf("  %-15s %12zu %12zu %12.1f %10.3f %10.3f\n", op_names[o], bytes,
                       bytes / es, (double)slowest, algbw, busbw);
            fflush(stdout);
        }
    }
    mt_device_free(dev, in);
    mt_device_free(dev, out);
    mt_finalize(rt);
    return rc;
}
