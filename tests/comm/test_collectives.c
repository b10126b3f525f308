/* Host collectives under mtrun: every collective x {f32, bf16} x sizes from 0 elements up to a
 * cap (--max-bytes, total buffer bytes), on the world group, a one-rank group, the even and odd
 * ranks, and the world in reverse order; send/recv both ways, broadcast from every root, several
 * operations in flight, overlap with compute, argument errors.
 *
 * Inputs are small integers (value depends on group rank and index) so that f32 and bf16 sums over
 * up to 8 ranks are exact; avg is checked against sum / n computed the same way (one rounding).
 *
 *   test_collectives [--max-bytes N] [--max-bytes-bf16 N] [--device-buffers]
 *   test_collectives --sleeper R      one rank stops answering; the others must time out naming R
 *   test_collectives --counters       the traffic counters (mt_group_counters) count launched
 *                                     collectives only: launches failed by
 *                                     MT_TEST_COLL_LAUNCH_FAIL=1 leave them unchanged
 */
#include "check.h"
#include "comm/work.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t max_bytes = 1u << 20;
static size_t max_bytes_bf16 = 1u << 20;
static int world_rank;

static float value(int grank, size_t i, int salt) {
    return (float)((int)((grank * 7 + (int)(i % 1021) * 3 + salt) % 16) - 8);
}

static void fill(void *buf, mt_dtype dt, size_t count, int grank, size_t offset, int salt) {
    for (size_t i = 0; i < count; i++) {
        float v = value(grank, offset + i, salt);
        if (dt == MT_F32) ((float *)buf)[i] = v;
        else ((mt_bf16 *)buf)[i] = mt_f32_to_bf16(v);
    }
}

static float get(const void *buf, mt_dtype dt, size_t i) {
    return dt == MT_F32 ? ((const float *)buf)[i] : mt_bf16_to_f32(((const mt_bf16 *)buf)[i]);
}

static float round_dt(mt_dtype dt, float v) {
    return dt == MT_F32 ? v : mt_bf16_to_f32(mt_f32_to_bf16(v));
}

static float reduce_ref(mt_reduce_op op, int n, size_t i, int salt, mt_dtype dt) {
    float acc = 0, mx = -INFINITY;
    for (int g = 0; g < n; g++) {
        float v = value(g, i, salt);
        acc += v;
        mx = v > mx ? v : mx;
    }
    if (op == MT_REDUCE_MAX) return mx;
    if (op == MT_REDUCE_AVG) return round_dt(dt, acc / (float)n);
    return acc;
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "rank %d: out of memory (%zu bytes)\n", world_rank, bytes);
        exit(2);
    }
    return p;
}

/* Communication buffers: malloc'd (UCX moves them), or with --device-buffers from the rank's CPU
 * device, whose large blocks local peers read through shared memory (comm/host/shm.c). */
static mt_device *buffer_device;

static void *buf_alloc(size_t bytes) {
    if (!buffer_device) return xmalloc(bytes);
    void *p = NULL;
    if (mt_device_alloc(buffer_device, bytes, MT_MEM_COMM, &p) != MT_OK) {
        fprintf(stderr, "rank %d: %s\n", world_rank, mt_last_error());
        exit(2);
    }
    return p;
}

/* Peers' CPU-device blocks mapped into this process: read-only shared mappings of their memfds. */
static int peer_blocks_mapped(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int count = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "meshtrain-cpu-block") && strstr(line, " r--s ")) count++;
    fclose(f);
    return count;
}

static void buf_free(void *p) {
    if (buffer_device) mt_device_free(buffer_device, p);
    else free(p);
}

/* Reports the first mismatching element only, to keep logs short. */
static int compare(const char *what, const void *got, mt_dtype dt, size_t count,
                   float (*expect)(size_t, const void *), const void *ctx) {
    for (size_t i = 0; i < count; i++) {
        float e = expect(i, ctx), g = get(got, dt, i);
        if (e != g) {
            fprintf(stderr, "rank %d: %s: element %zu of %zu is %g, expected %g\n", world_rank,
                    what, i, count, g, e);
            return 0;
        }
    }
    return 1;
}

typedef struct ctx {
    int n, grank, salt, root;
    size_t count;
    mt_dtype dt;
    mt_reduce_op op;
} ctx;

static float exp_gather(size_t i, const void *p) {
    const ctx *c = p;
    return value((int)(i / c->count), i % c->count, c->salt);
}
static float exp_rs(size_t i, const void *p) {
    const ctx *c = p;
    return reduce_ref(c->op, c->n, (size_t)c->grank * c->count + i, c->salt, c->dt);
}
static float exp_ar(size_t i, const void *p) {
    const ctx *c = p;
    return reduce_ref(c->op, c->n, i, c->salt, c->dt);
}
static float exp_bcast(size_t i, const void *p) {
    const ctx *c = p;
    return value(c->root, i, c->salt);
}

static const char *op_name(mt_reduce_op op) {
    return op == MT_REDUCE_SUM ? "sum" : op == MT_REDUCE_AVG ? "avg" : "max";
}

static void run_size(mt_group *g, mt_dtype dt, size_t total) {
    int n = mt_group_size(g), r = mt_group_rank(g);
    size_t es = mt_dtype_size(dt);
    char what[160];
    ctx c = {.n = n, .grank = r, .dt = dt, .salt = (int)(total % 13)};

    /* all_gather and reduce_scatter: per-rank count so that the total is about `total`. */
    size_t count = total / (size_t)n;
    if (total > 0 && count == 0) count = 1;
    c.count = count;
    void *in = buf_alloc(count * (size_t)n * es), *out = buf_alloc(count * (size_t)n * es);

    fill(in, dt, count, r, 0, c.salt);
    memset(out, 0xff, count * (size_t)n * es);
    snprintf(what, sizeof what, "all_gather %s count %zu on '%s'", mt_dtype_name(dt), count,
             mt_group_name(g));
    CHECK_OK(mt_all_gather(g, in, out, count, dt, NULL));
    CHECK_MSG(compare(what, out, dt, count * (size_t)n, exp_gather, &c), "%s", what);

    /* in place: own block already in the output */
    memset(out, 0xff, count * (size_t)n * es);
    fill((char *)out + (size_t)r * count * es, dt, count, r, 0, c.salt);
    snprintf(what, sizeof what, "in-place all_gather %s count %zu on '%s'", mt_dtype_name(dt),
             count, mt_group_name(g));
    CHECK_OK(mt_all_gather(g, (char *)out + (size_t)r * count * es, out, count, dt, NULL));
    CHECK_MSG(compare(what, out, dt, count * (size_t)n, exp_gather, &c), "%s", what);

    for (mt_reduce_op op = MT_REDUCE_SUM; op <= MT_REDUCE_AVG; op++) {
        c.op = op;
        fill(in, dt, count * (size_t)n, r, 0, c.salt);
        memset(out, 0xff, count * es);
        snprintf(what, sizeof what, "reduce_scatter(%s) %s count %zu on '%s'", op_name(op),
                 mt_dtype_name(dt), count, mt_group_name(g));
        CHECK_OK(mt_reduce_scatter(g, in, out, count, dt, op, NULL));
        CHECK_MSG(compare(what, out, dt, count, exp_rs, &c), "%s", what);
    }
    buf_free(in);
    buf_free(out);

    /* all_reduce and broadcast on exactly `total` elements (any count). */
    in = buf_alloc(total * es);
    out = buf_alloc(total * es);
    for (mt_reduce_op op = MT_REDUCE_SUM; op <= MT_REDUCE_MAX; op++) {
        c.op = op;
        fill(in, dt, total, r, 0, c.salt);
        memset(out, 0xff, total * es);
        snprintf(what, sizeof what, "all_reduce(%s) %s count %zu on '%s'", op_name(op),
                 mt_dtype_name(dt), total, mt_group_name(g));
        CHECK_OK(mt_all_reduce(g, in, out, total, dt, op, NULL));
        CHECK_MSG(compare(what, out, dt, total, exp_ar, &c), "%s", what);
    }
    c.op = MT_REDUCE_SUM;
    snprintf(what, sizeof what, "in-place all_reduce(sum) %s count %zu on '%s'",
             mt_dtype_name(dt), total, mt_group_name(g));
    CHECK_OK(mt_all_reduce(g, in, in, total, dt, MT_REDUCE_SUM, NULL));
    CHECK_MSG(compare(what, in, dt, total, exp_ar, &c), "%s", what);

    /* broadcast from every root (only the smaller sizes: it is n operations) */
    int roots = total * es <= (1u << 20) ? n : 1;
    for (int root = 0; root < roots; root++) {
        c.root = root;
        if (r == root) fill(out, dt, total, r, 0, c.salt);
        else memset(out, 0xff, total * es);
        snprintf(what, sizeof what, "broadcast from %d %s count %zu on '%s'", root,
                 mt_dtype_name(dt), total, mt_group_name(g));
        CHECK_OK(mt_broadcast(g, out, total, dt, root, NULL));
        CHECK_MSG(compare(what, out, dt, total, exp_bcast, &c), "%s", what);
    }
    buf_free(in);
    buf_free(out);
}

static void run_p2p(mt_group *g) {
    int n = mt_group_size(g), r = mt_group_rank(g);
    if (n < 2) return;
    size_t counts[] = {0, 1, 1023, 300000};
    for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
        size_t count = counts[k];
        for (int dir = 1; dir >= -1; dir -= 2) {
            int to = ((r + dir) % n + n) % n, from = ((r - dir) % n + n) % n;
            float *sb = buf_alloc(count * 4), *rb = buf_alloc(count * 4);
            fill(sb, MT_F32, count, r, 0, (int)k);
            memset(rb, 0xff, count * 4);
            mt_work *ws, *wr;
            CHECK_OK(mt_recv(g, rb, count, MT_F32, from, &wr));
            CHECK_OK(mt_send(g, sb, count, MT_F32, to, &ws));
            CHECK_OK(mt_work_wait(ws, -1));
            CHECK_OK(mt_work_wait(wr, -1));
            mt_work_free(ws);
            mt_work_free(wr);
            ctx c = {.root = from, .salt = (int)k};
            char what[128];
            snprintf(what, sizeof what, "recv of %zu floats from group rank %d on '%s' (dir %d)",
                     count, from, mt_group_name(g), dir);
            CHECK_MSG(compare(what, rb, MT_F32, count, exp_bcast, &c), "%s", what);
            buf_free(sb);
            buf_free(rb);
        }
    }
    /* two messages to the same peer arrive in order */
    if (n >= 2) {
        float a = (float)r, b = (float)(r + 100), x = -1, y = -1;
        int to = (r + 1) % n, from = (r + n - 1) % n;
        mt_work *w1, *w2, *w3, *w4;
        CHECK_OK(mt_send(g, &a, 1, MT_F32, to, &w1));
        CHECK_OK(mt_send(g, &b, 1, MT_F32, to, &w2));
        CHECK_OK(mt_recv(g, &x, 1, MT_F32, from, &w3));
        CHECK_OK(mt_recv(g, &y, 1, MT_F32, from, &w4));
        mt_work *all[4] = {w1, w2, w3, w4};
        for (int i = 0; i < 4; i++) {
            CHECK_OK(mt_work_wait(all[i], -1));
            mt_work_free(all[i]);
        }
        CHECK_MSG(x == (float)from && y == (float)(from + 100), "p2p order: got %g %g", x, y);
    }
}

/* Four all_gathers in flight, then an all_reduce overlapped with compute. */
static void run_inflight(mt_group *g) {
    int n = mt_group_size(g), r = mt_group_rank(g);
    enum { K = 4 };
    size_t count = 100003;
    float *in[K], *out[K];
    mt_work *w[K];
    for (int k = 0; k < K; k++) {
        in[k] = buf_alloc(count * 4);
        out[k] = buf_alloc(count * (size_t)n * 4);
        fill(in[k], MT_F32, count, r, 0, k);
        CHECK_OK(mt_all_gather(g, in[k], out[k], count, MT_F32, &w[k]));
    }
    for (int k = K - 1; k >= 0; k--) {
        CHECK_OK(mt_work_wait(w[k], -1));
        mt_work_free(w[k]);
        ctx c = {.n = n, .count = count, .salt = k};
        char what[96];
        snprintf(what, sizeof what, "in-flight all_gather %d on '%s'", k, mt_group_name(g));
        CHECK_MSG(compare(what, out[k], MT_F32, count * (size_t)n, exp_gather, &c), "%s", what);
        buf_free(in[k]);
        buf_free(out[k]);
    }

    size_t big = (size_t)1 << 20;
    float *a = buf_alloc(big * 4), *b = buf_alloc(big * 4);
    fill(a, MT_F32, big, r, 0, 5);
    mt_work *wa;
    CHECK_OK(mt_all_reduce(g, a, b, big, MT_F32, MT_REDUCE_SUM, &wa));
    double acc = 0;
    bool done = false;
    long rounds = 0;
    while (!done) {
        for (int i = 0; i < 20000; i++) acc += sin((double)i * 1e-3);
        rounds++;
        CHECK_OK(mt_work_test(wa, &done));
    }
    mt_work_free(wa);
    ctx c = {.n = n, .op = MT_REDUCE_SUM, .salt = 5, .dt = MT_F32};
    CHECK_MSG(compare("overlapped all_reduce", b, MT_F32, big, exp_ar, &c), "overlap");
    CHECK(isfinite(acc) && rounds > 0);
    buf_free(a);
    buf_free(b);
}

static void run_errors(mt_runtime *rt, mt_group *world) {
    float x = 0;
    CHECK(mt_reduce_scatter(world, &x, &x, 1, MT_F32, MT_REDUCE_MAX, NULL) == MT_ERR_INVALID_ARG);
    CHECK(mt_broadcast(world, &x, 1, MT_F32, mt_group_size(world), NULL) == MT_ERR_INVALID_ARG);
    CHECK(mt_send(world, &x, 1, MT_F32, -1, NULL) == MT_ERR_INVALID_ARG);
    int n = mt_runtime_world_size(rt), me = mt_runtime_rank(rt);
    if (n > 1) {
        int other = (me + 1) % n;
        mt_group *g = NULL;
        mt_status st = mt_group_create(rt, &other, 1, "not-me", &g);
        CHECK(st == MT_ERR_INVALID_ARG && g == NULL);
        CHECK_MSG(strstr(mt_last_error(), "not in the rank list") != NULL, "%s", mt_last_error());
    }
    int dup[2] = {me, me};
    mt_group *g = NULL;
    CHECK(mt_group_create(rt, dup, 2, "dup", &g) == MT_ERR_INVALID_ARG);
}

static void finish_kept(mt_work **w) {
    if (!*w) return;
    CHECK_OK(mt_work_wait(*w, -1));
    mt_work_free(*w);
    *w = NULL;
}

/* Every collective kind, handle kept and not, fails to launch (injected): nothing is counted;
 * then the same collectives launched for real are counted once each, with their payload. */
static void run_counters(mt_group *g) {
    int n = mt_group_size(g);
    float in[8 * 4] = {0}, out[8 * 4] = {0};
    if (n > 8) return;
    mt_group_counters_reset(g);
    for (int real = 0; real < 2; real++) {
        if (!real) mt_work_inject_launch_failure(true); /* as MT_TEST_COLL_LAUNCH_FAIL=1 */
        for (int keep = 0; keep < 2; keep++) {
            mt_work *w = NULL, **wp = keep ? &w : NULL;
            mt_status st[4];
            st[0] = mt_all_gather(g, in, out, 4, MT_F32, wp);
            finish_kept(&w);
            st[1] = mt_reduce_scatter(g, in, out, 4, MT_F32, MT_REDUCE_SUM, wp);
            finish_kept(&w);
            st[2] = mt_all_reduce(g, in, out, 4, MT_F32, MT_REDUCE_SUM, wp);
            finish_kept(&w);
            st[3] = mt_broadcast(g, out, 4, MT_F32, 0, wp);
            finish_kept(&w);
            for (int k = 0; k < 4; k++)
                CHECK_MSG(real ? st[k] == MT_OK : st[k] == MT_ERR_COMM,
                          "%s %s (handle %s): status %d", real ? "launched" : "injected",
                          mt_coll_kind_name((mt_coll_kind)k), keep ? "kept" : "not kept",
                          (int)st[k]);
            if (!real)
                CHECK_MSG(strstr(mt_last_error(), "MT_TEST_COLL_LAUNCH_FAIL"), "%s",
                          mt_last_error());
        }
        if (!real) mt_work_inject_launch_failure(false);
        mt_comm_counters c;
        mt_group_counters(g, &c);
        for (int k = 0; k < MT_COLL_KINDS; k++) {
            /* all_gather and reduce_scatter move size x count elements, the others count. */
            uint64_t bytes = 4 * sizeof(float) * (k < 2 ? (uint64_t)n : 1);
            uint64_t want_calls = real ? 2 : 0, want_bytes = real ? 2 * bytes : 0;
            CHECK_MSG(c.calls[k] == want_calls && c.bytes[k] == want_bytes,
                      "after %s launches: %s counted %llu calls, %llu bytes (expected %llu, %llu)",
                      real ? "real" : "failed", mt_coll_kind_name((mt_coll_kind)k),
                      (unsigned long long)c.calls[k], (unsigned long long)c.bytes[k],
                      (unsigned long long)want_calls, (unsigned long long)want_bytes);
        }
    }
}

static void run_group(mt_group *g) {
    size_t sizes[] = {0, 1, 7, 1023, 3 * 5 * 7 * 11 + 1, 16383, 16384, 16385, 32767, 32768,
                      32769, (1u << 20) / 4 + 3, (1u << 20) / 2, (16u << 20) / 4 + 1,
                      (64u << 20) / 4, (64u << 20) / 2 /* 64 MiB of bf16 */};
    for (int d = 0; d < 2; d++) {
        mt_dtype dt = d == 0 ? MT_F32 : MT_BF16;
        size_t cap = dt == MT_F32 ? max_bytes : max_bytes_bf16;
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            size_t total = sizes[i];
            if (total * mt_dtype_size(dt) > cap) continue;
            run_size(g, dt, total);
        }
    }
    CHECK_OK(mt_barrier(g, NULL));
    run_p2p(g);
    run_inflight(g);
    CHECK_OK(mt_barrier(g, NULL));
}

static int sleeper_test(mt_runtime *rt, int sleeper) {
    mt_group *world = mt_runtime_world(rt);
    int n = mt_runtime_world_size(rt), me = mt_runtime_rank(rt);
    int *all = xmalloc((size_t)n * sizeof *all);
    for (int i = 0; i < n; i++) all[i] = i;
    mt_group *second = NULL;
    CHECK_OK(mt_group_create(rt, all, n, "second", &second));
    free(all);
    CHECK_OK(mt_barrier(world, NULL));
    char rank_text[32];
    snprintf(rank_text, sizeof rank_text, "rank %d ", sleeper);
    if (me == sleeper) {
        /* Stop answering: miss both collectives, then leave quietly. */
        sleep((unsigned)(mt_runtime_timeout(rt) + 6));
        mt_group_destroy(second);
        mt_finalize(rt);
        return check_report("test_collectives --sleeper (sleeping rank)");
    }
    float buf[64] = {0};
    mt_work *w;
    CHECK_OK(mt_all_reduce(world, buf, buf, 64, MT_F32, MT_REDUCE_SUM, &w));
    mt_status st = mt_work_wait(w, 2.0);
    const char *msg = mt_last_error();
    fprintf(stderr, "rank %d: expected timeout: %s\n", me, msg);
    CHECK(st == MT_ERR_TIMEOUT);
    CHECK_MSG(strstr(msg, "all_reduce on group 'world'") && strstr(msg, "timed out") &&
                  strstr(msg, rank_text),
              "message: %s", msg);
    mt_work_free(w);
    /* the group is unusable now, with a clear error */
    st = mt_all_reduce(world, buf, buf, 64, MT_F32, MT_REDUCE_SUM, NULL);
    CHECK(st != MT_OK);
    CHECK_MSG(strstr(mt_last_error(), "unusable") != NULL, "%s", mt_last_error());
    /* a blocking call honours MT_TIMEOUT_S */
    st = mt_all_reduce(second, buf, buf, 64, MT_F32, MT_REDUCE_SUM, NULL);
    msg = mt_last_error();
    fprintf(stderr, "rank %d: expected timeout: %s\n", me, msg);
    CHECK(st == MT_ERR_TIMEOUT);
    CHECK_MSG(strstr(msg, "group 'second'") && strstr(msg, rank_text), "message: %s", msg);
    mt_group_destroy(second);
    mt_finalize(rt);
    return check_report("test_collectives --sleeper");
}

int main(int argc, char **argv) {
    int sleeper = -1;
    bool device_buffers = false, counters_only = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc) max_bytes = strtoull(argv[++i], 0, 10);
        else if (!strcmp(argv[i], "--max-bytes-bf16") && i + 1 < argc)
            max_bytes_bf16 = strtoull(argv[++i], 0, 10);
        else if (!strcmp(argv[i], "--sleeper") && i + 1 < argc) sleeper = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device-buffers")) device_buffers = true;
        else if (!strcmp(argv[i], "--counters")) counters_only = true;
        else {
            fprintf(stderr, "usage: %s [--max-bytes N] [--max-bytes-bf16 N] [--device-buffers] "
                    "[--sleeper R] [--counters]\n",
                    argv[0]);
            return 2;
        }
    }
    mt_runtime *rt;
    mt_status st = mt_init(&rt, &argc, &argv);
    if (st != MT_OK) {
        fprintf(stderr, "mt_init failed: %s\n", mt_last_error());
        return 1;
    }
    world_rank = mt_runtime_rank(rt);
    if (sleeper >= 0) return sleeper_test(rt, sleeper);
    if (device_buffers) buffer_device = mt_runtime_device(rt);

    mt_group *world = mt_runtime_world(rt);
    int n = mt_runtime_world_size(rt), me = mt_runtime_rank(rt);
    if (counters_only) {
        run_counters(world);
        mt_finalize(rt);
        return check_report("test_collectives --counters");
    }
    run_errors(rt, world);
    run_group(world);
    if (device_buffers && n >= 2) {
        /* The shared-memory path maps peers' blocks read-only here; MT_COMM_SHM=0 must not, nor
         * a host whose kernel refuses pidfd_getfd (played by MT_TEST_PIDFD_GETFD_FAIL). */
        const char *env = getenv("MT_COMM_SHM"), *refused = getenv("MT_TEST_PIDFD_GETFD_FAIL");
        bool want = !(env && !strcmp(env, "0")) && !(refused && *refused);
        int mapped = peer_blocks_mapped();
        CHECK_MSG((mapped > 0) == want, "rank %d maps %d peer block(s); MT_COMM_SHM=%s",
                  world_rank, mapped, env ? env : "(unset)");
    }

    /* subgroups: this rank alone; even and odd ranks; the world in reverse order */
    mt_group *self = NULL, *parity = NULL, *reverse = NULL;
    CHECK_OK(mt_group_create(rt, &me, 1, "self", &self));
    if (self) run_group(self);
    if (n >= 2) {
        int *ranks = xmalloc((size_t)n * sizeof *ranks), k = 0;
        for (int i = me % 2; i < n; i += 2) ranks[k++] = i;
        CHECK_OK(mt_group_create(rt, ranks, k, me % 2 ? "odd" : "even", &parity));
        for (int i = 0; i < n; i++) ranks[i] = n - 1 - i;
        CHECK_OK(mt_group_create(rt, ranks, n, "reverse", &reverse));
        free(ranks);
        if (parity) run_group(parity);
        if (reverse) {
            CHECK(mt_group_rank(reverse) == n - 1 - me);
            size_t saved = max_bytes, saved16 = max_bytes_bf16;
            max_bytes = max_bytes_bf16 = saved < (1u << 20) ? saved : (1u << 20);
            run_group(reverse);
            max_bytes = saved;
            max_bytes_bf16 = saved16;
        }
    }
    mt_group_destroy(self);
    mt_group_destroy(parity);
    mt_group_destroy(reverse);
    CHECK_OK(mt_barrier(world, NULL));
    mt_finalize(rt);
    char name[64];
    snprintf(name, sizeof name, "test_collectives (rank %d of %d)", me, n);
    return check_report(name);
}
