/* Collectives on GPU buffers through a mesh group's NCCL communicator (comm/nccl/nccl_coll.c), run
 * under mtrun on every rank of the job:
 *
 *   mtrun --standalone --nproc_per_node N test_gpu_nccl [--timeout-check] [--bench-mib M]
 *
 * Checks every collective in f32 and bf16 against values computed on the host (small integers,
 * exact in bf16, so the expected results are exact), in place and out of place, asynchronous
 * work overlapping a kernel on the default stream, the ordering of a collective after the kernel
 * that wrote its input, host scalars on the same group (host transport), the errors for mixed
 * and world-group GPU buffers, and NCCL's memory charged to `comm`. --timeout-check: rank 0
 * skips one all-reduce; the others must get MT_ERR_TIMEOUT naming the operation, the group and
 * MT_TIMEOUT_S from a wait bounded to 4 s, and the group must refuse later work. --bench-mib M: an
 * all-reduce bandwidth figure (nccl-tests' bus bandwidth) for an M MiB f32 buffer.
 * Several ranks on one GPU need NCCL >= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1. Exits 77
 * (ctest: skipped) without a GPU. */
#include "check.h"

#include <meshtrain/comm.h>
#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/mesh.h>
#include <meshtrain/ops.h>
#include <meshtrain/runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SKIPPED 77

static mt_runtime *rt;
static mt_device *dev;
static int rank, world;

static void *dalloc(size_t bytes) {
    void *p = NULL;
    CHECK_OK(mt_device_alloc(dev, bytes, MT_MEM_OTHER, &p));
    return p;
}

/* Host values as dtype into device memory, and back as f32. */
static void put(void *d, const float *h, size_t n, mt_dtype dt) {
    if (dt == MT_F32) {
        CHECK_OK(mt_device_copy(dev, d, h, n * 4, MT_COPY_HOST_TO_DEVICE, NULL));
        return;
    }
    mt_bf16 *b = malloc((n ? n : 1) * sizeof *b);
    for (size_t i = 0; i < n; i++) b[i] = mt_f32_to_bf16(h[i]);
    CHECK_OK(mt_device_copy(dev, d, b, n * 2, MT_COPY_HOST_TO_DEVICE, NULL));
    free(b);
}

static float *get(const void *d, size_t n, mt_dtype dt) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    if (dt == MT_F32) {
        CHECK_OK(mt_device_copy(dev, h, d, n * 4, MT_COPY_DEVICE_TO_HOST, NULL));
        return h;
    }
    mt_bf16 *b = malloc((n ? n : 1) * sizeof *b);
    CHECK_OK(mt_device_copy(dev, b, d, n * 2, MT_COPY_DEVICE_TO_HOST, NULL));
    for (size_t i = 0; i < n; i++) h[i] = mt_bf16_to_f32(b[i]);
    free(b);
    return h;
}

/* Rank r's i-th value: a small integer, exact in bf16 and in every sum here. The averages are
 * exact too for group sizes that are powers of two (1, 2, 4, 8); other sizes would need a
 * tolerance. */
static float val(int r, size_t i) { return (float)((r + 1) * (int)(i % 5 + 1)); }

static void expect(const char *what, mt_dtype dt, const float *got, const float *want, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i] && bad++ == 0) first = i;
    CHECK_MSG(bad == 0, "rank %d: %s (%s, %zu elements): %zu wrong, first [%zu] = %g, want %g",
              rank, what, mt_dtype_name(dt), n, bad, first, bad ? got[first] : 0.0,
              bad ? want[first] : 0.0);
}

static void check_collectives(mt_group *g, mt_dtype dt, size_t n) {
    size_t es = mt_dtype_size(dt);
    int gs = mt_group_size(g), gr = mt_group_rank(g);
    float *h = malloc(n * (size_t)gs * sizeof *h), *want = malloc(n * (size_t)gs * sizeof *want);
    void *send = dalloc(n * (size_t)gs * es), *recv = dalloc(n * (size_t)gs * es);

    /* all_gather, out of place and in place */
    for (size_t i = 0; i < n; i++) h[i] = val(gr, i);
    put(send, h, n, dt);
    CHECK_OK(mt_all_gather(g, send, recv, n, dt, NULL));
    for (int r = 0; r < gs; r++)
        for (size_t i = 0; i < n; i++) want[(size_t)r * n + i] = val(r, i);
    float *got = get(recv, n * (size_t)gs, dt);
    expect("all_gather", dt, got, want, n * (size_t)gs);
    free(got);
    put((char *)recv + (size_t)gr * n * es, h, n, dt);
    CHECK_OK(mt_all_gather(g, (char *)recv + (size_t)gr * n * es, recv, n, dt, NULL));
    got = get(recv, n * (size_t)gs, dt);
    expect("all_gather in place", dt, got, want, n * (size_t)gs);
    free(got);

    /* reduce_scatter sum and avg */
    for (size_t i = 0; i < n * (size_t)gs; i++) h[i] = val(gr, i);
    for (mt_reduce_op op = MT_REDUCE_SUM; op <= MT_REDUCE_AVG; op++) {
        put(send, h, n * (size_t)gs, dt);
        CHECK_OK(mt_reduce_scatter(g, send, recv, n, dt, op, NULL));
        for (size_t i = 0; i < n; i++) {
            float s = 0;
            for (int r = 0; r < gs; r++) s += val(r, (size_t)gr * n + i);
            want[i] = op == MT_REDUCE_AVG ? s / (float)gs : s;
        }
        got = get(recv, n, dt);
        expect(op == MT_REDUCE_SUM ? "reduce_scatter sum" : "reduce_scatter avg", dt, got, want,
               n);
        free(got);
    }

    /* all_reduce sum (in place), avg, max */
    for (mt_reduce_op op = MT_REDUCE_SUM; op <= MT_REDUCE_MAX; op++) {
        for (size_t i = 0; i < n; i++) h[i] = val(gr, i);
        put(send, h, n, dt);
        void *out = op == MT_REDUCE_SUM ? send : recv;
        CHECK_OK(mt_all_reduce(g, send, out, n, dt, op, NULL));
        for (size_t i = 0; i < n; i++) {
            float s = 0;
            for (int r = 0; r < gs; r++) s += val(r, i);
            want[i] = op == MT_REDUCE_SUM ? s : op == MT_REDUCE_AVG ? s / (float)gs : val(gs - 1, i);
        }
        got = get(out, n, dt);
        expect(op == MT_REDUCE_SUM ? "all_reduce sum in place" : op == MT_REDUCE_AVG ?
               "all_reduce avg" : "all_reduce max", dt, got, want, n);
        free(got);
    }

    /* broadcast from the last group rank */
    for (size_t i = 0; i < n; i++) h[i] = val(gr, i);
    put(send, h, n, dt);
    CHECK_OK(mt_broadcast(g, send, n, dt, gs - 1, NULL));
    for (size_t i = 0; i < n; i++) want[i] = val(gs - 1, i);
    got = get(send, n, dt);
    expect("broadcast", dt, got, want, n);
    free(got);

    mt_device_free(dev, send);
    mt_device_free(dev, recv);
    free(h);
    free(want);
}

/* A collective issued right after the kernels that write its input must see their result (the
 * communicator's stream waits for the default stream), and work left running while more kernels
 * are queued must still finish. Out of place, so that even one rank (a copy on the NCCL stream)
 * would read x too early without the wait; a long queue of kernels in front makes that likely. */
static void check_ordering(mt_group *g) {
    size_t n = (size_t)16 << 20; /* 64 MiB */
    int gs = mt_group_size(g);
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = val(rank, i);
    float *x = dalloc(n * 4), *y = dalloc(n * 4), *other = dalloc(n * 4);
    put(x, h, n, MT_F32);
    CHECK_OK(mt_device_memset(dev, y, 0, n * 4, NULL));
    CHECK_OK(mt_device_memset(dev, other, 0, n * 4, NULL));
    for (int rep = 0; rep < 200; rep++) { /* x unchanged, exactly: powers of two */
        CHECK_OK(mt_op_scale(dev, x, 2.0f, n));
        CHECK_OK(mt_op_scale(dev, x, 0.5f, n));
    }
    CHECK_OK(mt_op_scale(dev, x, 16.0f, n)); /* the last kernel before the collective */
    mt_work *w = NULL;
    CHECK_OK(mt_all_reduce(g, x, y, n, MT_F32, MT_REDUCE_SUM, &w));
    for (size_t i = 0; i < 64; i++) /* compute queued beside the collective */
        CHECK_OK(mt_op_scale(dev, other, 3.0f, n));
    bool done = false;
    CHECK_OK(mt_work_test(w, &done));
    CHECK_OK(mt_work_wait(w, -1));
    mt_work_free(w);
    float *got = get(y, n, MT_F32), *oth = get(other, n, MT_F32);
    size_t bad = 0, bad_other = 0;
    for (size_t i = 0; i < n; i++) {
        float s = 0;
        for (int r = 0; r < gs; r++) s += 16.0f * val(r, i);
        if (got[i] != s) bad++;
        if (oth[i] != 0.0f) bad_other++;
    }
    CHECK_MSG(bad == 0, "rank %d: all_reduce after 401 scale kernels: %zu of %zu wrong (the "
              "collective did not wait for the default stream)", rank, bad, n);
    CHECK_MSG(bad_other == 0, "rank %d: the kernels beside the collective: %zu wrong", rank,
              bad_other);
    free(got);
    free(oth);
    free(h);
    mt_device_free(dev, x);
    mt_device_free(dev, y);
    mt_device_free(dev, other);
}

static void check_errors(mt_group *g) {
    float host = (float)(rank + 1), *d = dalloc(4);
    /* A host scalar on the same group goes through the host transport. */
    CHECK_OK(mt_all_reduce(g, &host, &host, 1, MT_F32, MT_REDUCE_SUM, NULL));
    int gs = mt_group_size(g);
    float want = 0;
    for (int r = 0; r < gs; r++) want += (float)(mt_group_global_rank(g, r) + 1);
    CHECK_MSG(host == want, "rank %d: host all_reduce on the NCCL group gave %g, want %g", rank,
              host, want);
    mt_status st = mt_all_reduce(g, &host, d, 1, MT_F32, MT_REDUCE_SUM, NULL);
    CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error(), "same side"));
    st = mt_all_reduce(mt_runtime_world(rt), d, d, 1, MT_F32, MT_REDUCE_SUM, NULL);
    CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error(), "no NCCL communicator"));
    st = mt_send(g, d, 1, MT_F32, 0, NULL); /* refused before anything is queued */
    CHECK(st == MT_ERR_UNSUPPORTED && strstr(mt_last_error(), "point-to-point"));
    mt_device_free(dev, d);
}

static void check_memory(void) {
    mt_mem_stats s;
    mt_device_mem_stats(dev, &s);
    /* One rank alone may need no NCCL buffers at all; ranks sharing a GPU are not charged (the
     * GPU-wide measure would count the others' buffers). */
    if (world > 1 && mt_device_cuda_count(NULL, 0) >= mt_runtime_local_world_size(rt))
        CHECK_MSG(s.current[MT_MEM_COMM] > 0, "rank %d: NCCL's GPU memory is not charged to comm",
                  rank);
    char report[1024];
    if (rank == 0) printf("rank 0 memory after creating the communicators:\n%s\n",
                          mt_memory_report(dev, report, sizeof report));
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void bench(mt_group *g, size_t mib) {
    size_t n = mib << 18;
    float *x = dalloc(n * 4);
    CHECK_OK(mt_device_memset(dev, x, 0, n * 4, NULL));
    CHECK_OK(mt_all_reduce(g, x, x, n, MT_F32, MT_REDUCE_SUM, NULL)); /* warm-up */
    int iters = 20;
    double t0 = now_s();
    for (int i = 0; i < iters; i++) CHECK_OK(mt_all_reduce(g, x, x, n, MT_F32, MT_REDUCE_SUM, NULL));
    double dt = (now_s() - t0) / iters;
    int gs = mt_group_size(g);
    double algbw = (double)n * 4 / dt / 1e9, busbw = algbw * 2.0 * (gs - 1) / gs;
    if (rank == 0)
        printf("all_reduce f32 %zu MiB on %d ranks: %.3f ms, algbw %.1f GB/s, busbw %.1f GB/s\n",
               mib, gs, dt * 1e3, algbw, busbw);
    mt_device_free(dev, x);
}

static void timeout_check(mt_group *g) {
    if (world < 2) {
        printf("test_gpu_nccl --timeout-check needs two ranks or more; nothing to check\n");
        return;
    }
    float *d = dalloc(4);
    CHECK_OK(mt_device_memset(dev, d, 0, 4, NULL));
    if (rank == 0) {
        /* Skips the all-reduce; stays alive past the others' timeout so that they see a silent
         * peer rather than a dead one. */
        struct timespec ts = {10, 0};
        nanosleep(&ts, NULL);
    } else {
        /* An explicit wait bound rather than a small MT_TIMEOUT_S, which would also bound the
         * communicators' creation. */
        double t0 = now_s();
        mt_work *w = NULL;
        mt_status st = mt_all_reduce(g, d, d, 1, MT_F32, MT_REDUCE_SUM, &w);
        if (st == MT_OK) st = mt_work_wait(w, 4.0);
        double took = now_s() - t0;
        mt_work_free(w);
        const char *msg = mt_last_error();
        CHECK_MSG(st == MT_ERR_TIMEOUT && strstr(msg, "all_reduce") && strstr(msg, "'x'") &&
                  strstr(msg, "MT_TIMEOUT_S"),
                  "rank %d: status %s, message: %s", rank, mt_status_str(st), msg);
        CHECK_MSG(took < 30.0, "rank %d: the timeout took %.1f s", rank, took);
        st = mt_all_reduce(g, d, d, 1, MT_F32, MT_REDUCE_SUM, NULL);
        CHECK_MSG(st != MT_OK, "rank %d: the group accepted work after the abort", rank);
        printf("rank %d: timed out after %.1f s as expected: %s\n", rank, took, msg);
    }
    mt_device_free(dev, d);
}

int main(int argc, char **argv) {
    if (mt_device_cuda_count(NULL, 0) == 0) {
        printf("test_gpu_nccl: no GPU; skipped\n");
        return SKIPPED;
    }
    bool timeout_mode = false;
    size_t bench_mib = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--timeout-check")) timeout_mode = true;
        else if (!strcmp(argv[i], "--bench-mib") && i + 1 < argc) bench_mib = strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: test_gpu_nccl [--timeout-check] [--bench-mib M]\n");
            return 2;
        }
    }
    setenv("MT_DEVICE", "cuda", 1);
    CHECK_OK(mt_init(&rt, &argc, &argv));
    if (!rt) return check_report("test_gpu_nccl");
    rank = mt_runtime_rank(rt);
    world = mt_runtime_world_size(rt);
    mt_mesh *mesh = NULL;
    const char *names[] = {"x"};
    CHECK_OK(mt_mesh_create(rt, 1, &world, names, &mesh));
    mt_group *g = NULL;
    if (mesh) CHECK_OK(mt_mesh_group(mesh, "x", &g));
    dev = mt_runtime_device(rt);
    if (g && mt_device_get_kind(dev) == MT_DEVICE_CUDA) {
        if (timeout_mode) {
            timeout_check(g);
        } else {
            check_memory();
            size_t sizes[] = {1, 7, 1000, 1 << 20};
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
                check_collectives(g, MT_F32, sizes[s]);
                check_collectives(g, MT_BF16, sizes[s]);
            }
            check_ordering(g);
            check_errors(g);
            if (bench_mib) bench(g, bench_mib);
        }
    } else {
        CHECK_MSG(false, "rank %d: no mesh group or the device is %s", rank,
                  dev ? mt_device_name(dev) : "none");
    }
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    char name[64];
    snprintf(name, sizeof name, "test_gpu_nccl rank %d/%d", rank, world);
    return check_report(name);
}
