/* mt-bench-adamw: the host AdamW (core/cpu/adamw_host.c) against the memory bandwidth it needs.
 *
 *   mt-bench-adamw [--params 16777216] [--rounds 5] [--threads 1,2,...] [--isa scalar,avx2,...]
 *
 * AdamW is memory-bound: per parameter it reads param, grad, m and v and writes param, m and v,
 * 28 bytes. The bound is measured in the same run by a STREAM-like kernel with the same pattern
 * over the same arrays (p += g, m += g, v += g: 4 reads, 3 writes, next to no arithmetic), on the
 * same pool and chunks, so the fraction of it that AdamW reaches says how much of the step is
 * left to arithmetic. For each thread count (default: 1, powers of two, and the rank's default
 * from core/thread_pool.c) and each path (default: all this CPU has) it prints parameters per
 * second and GB/s, best of --rounds after one warm-up, and the fraction of the bound on the same
 * threads. Rounds interleave the bound and the paths so that a busy moment of a shared machine
 * slows all of them. The default size, 16M parameters (256 MiB of arrays), is far beyond the
 * caches. PyTorch's fused AdamW is not compared (it would need a several-GB torch install).
 */
#include "core/clock.h"
#include "core/cpu/adamw_host.h"
#include "core/host_alloc.h"
#include "core/thread_pool.h"

#include <meshtrain/status.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "mt-bench-adamw"
#define BYTES_PER_PARAM 28.0
enum { MAX_LIST = 32 };

typedef struct options {
    long params, rounds;
    int threads[MAX_LIST], n_threads;
    mt_adamw_isa isa[MT_ADAMW_ISA_COUNT];
    int n_isa;
} options;

static int bad(const char *what, const char *value, const char *why) {
    fprintf(stderr, PROG ": bad option %s%s%s: %s\n", what, value ? " " : "", value ? value : "",
            why);
    return -1;
}

static bool parse_long(const char *s, long min, long *out) {
    char *end = NULL;
    long x = strtol(s, &end, 10);
    if (end == s || *end || x < min) return false;
    *out = x;
    return true;
}

/* Splits a comma-separated list into at most MAX_LIST items of up to 15 characters; returns
 * their count, or -1 when there are more or longer ones. Empty items are skipped. */
static int split_list(const char *val, char items[MAX_LIST][16]) {
    int n = 0;
    for (const char *p = val; *p;) {
        size_t len = strcspn(p, ",");
        if (len >= 16 || (len > 0 && n == MAX_LIST)) return -1;
        if (len > 0) {
            memcpy(items[n], p, len);
            items[n++][len] = '\0';
        }
        p += len + (p[len] == ',');
    }
    return n;
}

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.params = 16L << 20, .rounds = 5};
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val) return bad(name, NULL, "unknown, or missing its value");
        i++;
        if (!strcmp(name, "--params")) {
            if (!parse_long(val, 1, &o->params)) return bad(name, val, "an integer >= 1");
        } else if (!strcmp(name, "--rounds")) {
            if (!parse_long(val, 1, &o->rounds)) return bad(name, val, "an integer >= 1");
        } else if (!strcmp(name, "--threads")) {
            char items[MAX_LIST][16];
            int n = split_list(val, items);
            for (int k = 0; k < n; k++) {
                long t;
                if (!parse_long(items[k], 1, &t) || t > MT_THREAD_POOL_MAX) n = -1;
                else o->threads[k] = (int)t;
            }
            if (n < 1) return bad(name, val, "a list of at most 32 thread counts in 1..1024");
            o->n_threads = n;
        } else if (!strcmp(name, "--isa")) {
            char items[MAX_LIST][16];
            int n = split_list(val, items);
            for (int k = 0; k < n; k++) {
                int isa = 0;
                while (isa < MT_ADAMW_ISA_COUNT && strcmp(items[k], mt_adamw_isa_name(isa))) isa++;
                if (isa == MT_ADAMW_ISA_COUNT || k >= MT_ADAMW_ISA_COUNT)
                    return bad(name, val, "a list of scalar, avx2, avx512");
                if (!mt_adamw_isa_supported((mt_adamw_isa)isa))
                    return bad(name, val, "this CPU lacks one of them");
                o->isa[k] = (mt_adamw_isa)isa;
            }
            if (n < 1) return bad(name, val, "a list of scalar, avx2, avx512");
            o->n_isa = n;
        } else {
            return bad(name, NULL, "unknown (--params, --rounds, --threads, --isa)");
        }
    }
    if (!o->n_isa)
        for (int k = 0; k < MT_ADAMW_ISA_COUNT; k++)
            if (mt_adamw_isa_supported((mt_adamw_isa)k)) o->isa[o->n_isa++] = (mt_adamw_isa)k;
    if (!o->n_threads) {
        int def = 1;
        if (mt_thread_pool_default_threads(&def) != MT_OK) {
            fprintf(stderr, PROG ": %s\n", mt_last_error());
            return -1;
        }
        for (int t = 1; t < def && o->n_threads < MAX_LIST - 1; t *= 2) o->threads[o->n_threads++] = t;
        o->threads[o->n_threads++] = def;
    }
    return 0;
}

typedef struct arrays {
    float *p, *g, *m, *v;
} arrays;

/* The bound: AdamW's memory traffic with next to no arithmetic. Cloned per instruction set so
 * that the bound is not held back by narrow loads. */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void stream_kernel(float *restrict p, const float *restrict g, float *restrict m,
                          float *restrict v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = g[i];
        p[i] += x;
        m[i] += x;
        v[i] += x;
    }
}

static void stream_chunk(void *ctx, size_t chunk, size_t begin, size_t end) {
    arrays *a = ctx;
    stream_kernel(a->p + begin, a->g + begin, a->m + begin, a->v + begin, end - begin);
}

/* First touch from the pool's threads, in the chunks the timed loops use. */
static void init_chunk(void *ctx, size_t chunk, size_t begin, size_t end) {
    arrays *a = ctx;
    for (size_t i = begin; i < end; i++) {
        float x = (float)((i * 2654435761u) % 1000) * 1e-6f - 5e-4f;
        a->p[i] = 0.01f * (float)(i % 97);
        a->g[i] = x;
        a->m[i] = 0.1f * x;
        a->v[i] = x * x;
    }
}

static void print_line(int threads, const char *what, double s, long params, double bound_s) {
    double rate = (double)params / s;
    printf("threads %-3d %-30s %8.2f GB/s %10.1f Mparam/s", threads, what,
           rate * BYTES_PER_PARAM / 1e9, rate / 1e6);
    if (bound_s > 0.0) printf("   %5.1f%% of the bound", 100.0 * bound_s / s);
    printf("\n");
}

static mt_status run(const options *o) {
    size_t n = (size_t)o->params, bytes = n * sizeof(float);
    arrays a = {mt_host_alloc(bytes, 64), mt_host_alloc(bytes, 64), mt_host_alloc(bytes, 64),
                mt_host_alloc(bytes, 64)};
    mt_status st = MT_OK;
    if (!a.p || !a.g || !a.m || !a.v) {
        fprintf(stderr, PROG ": out of host memory for 4 x %zu bytes\n", bytes);
        st = MT_ERR_OUT_OF_MEMORY;
    }
    printf("%zu parameters, %.0f bytes each per step (%.1f MiB), best of %ld rounds after a "
           "warm-up; the bound: p += g, m += g, v += g on the same arrays\n",
           n, BYTES_PER_PARAM, BYTES_PER_PARAM * (double)n / (1 << 20), o->rounds);
    long step = 1;
    for (int ti = 0; st == MT_OK && ti < o->n_threads; ti++) {
        mt_thread_pool *pool = NULL;
        st = mt_thread_pool_create(o->threads[ti], &pool);
        if (st == MT_OK) st = mt_parallel_for(pool, n, MT_ADAMW_GRAIN, init_chunk, &a);
        double best[1 + MT_ADAMW_ISA_COUNT];
        for (int k = 0; k <= o->n_isa; k++) best[k] = 1e300;
        /* Round 0 is the warm-up. */
        for (long r = 0; st == MT_OK && r <= o->rounds; r++)
            for (int k = 0; st == MT_OK && k <= o->n_isa; k++) {
                double t0 = mt_clock_now_s();
                if (k == 0) st = mt_parallel_for(pool, n, MT_ADAMW_GRAIN, stream_chunk, &a);
                else
                    st = mt_host_adamw(pool, o->isa[k - 1], a.p, a.g, a.m, a.v, n, step++,
                                       1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f);
                double s = mt_clock_now_s() - t0;
                if (r > 0 && s < best[k]) best[k] = s;
            }
        if (st == MT_OK) {
            print_line(o->threads[ti], "bound (4 reads, 3 writes)", best[0], o->params, 0.0);
            for (int k = 1; k <= o->n_isa; k++) {
                char what[64];
                snprintf(what, sizeof what, "adamw %s", mt_adamw_isa_name(o->isa[k - 1]));
                print_line(o->threads[ti], what, best[k], o->params, best[0]);
            }
        }
        mt_thread_pool_destroy(pool);
    }
    if (st != MT_OK && mt_last_error()[0]) fprintf(stderr, PROG ": %s\n", mt_last_error());
    free(a.p);
    free(a.g);
    free(a.m);
    free(a.v);
    return st;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o) != 0) return 2;
    return run(&o) == MT_OK ? 0 : 1;
}
