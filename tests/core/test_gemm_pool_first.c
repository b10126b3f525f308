/* A one-block f32 product issued before the rank's thread pool exists gives the bits of the same
 * product issued after it (core/cpu/ops_gemm.c creates the pool first, which sets OpenBLAS to one
 * thread: without that, the first product of a process would run on OpenBLAS's own threads,
 * whose split changes the bits, e.g. some 600-3000 of 96 x 96 elements with OpenBLAS 0.3.21).
 *
 * Each case runs in a fresh process (this program again, exec'd with --child) so that the
 * product under test is the process's first, with OpenBLAS put on 4 threads before it (as a
 * program or OPENBLAS_NUM_THREADS may leave it; checked to have taken effect, else the case
 * could not see a product on OpenBLAS's threads) and MT_NUM_THREADS = 1, 2, 3 or 7. The child computes a small one-block product (three shapes: NN, TN, NT), then a large
 * one cut into several blocks, then the small one again, and checks that the first and the
 * third equal, bit for bit, one cblas_sgemm call on one OpenBLAS thread (a one-block product is
 * that call). The parent checks that every pool size gave the 1-thread pool's bits for both. */
#include "check.h"
#include "numeric.h"

#include <meshtrain/device.h>
#include <meshtrain/ops.h>

#include <cblas.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct shape {
    int m, n, k;
    bool ta, tb;
} shape;

/* One block each (under twice the f32 products' minimum block work, core/cpu/gemm_split.c), and
 * above OpenBLAS's threshold for threading: the first split by rows, the others by columns
 * (m < n) or rows with a transposed operand. */
static const shape small_shapes[] = {{96, 96, 96, false, false},
                                     {47, 200, 333, true, false},
                                     {130, 50, 257, false, true}};
enum { N_SMALL = sizeof small_shapes / sizeof *small_shapes };
/* Two row blocks (288 and 224 rows) on any pool. */
static const shape large_shape = {512, 256, 256, false, false};
static const int pool_sizes[] = {1, 2, 3, 7};
enum { N_POOLS = sizeof pool_sizes / sizeof *pool_sizes };

static size_t out_floats(const shape *s) { return (size_t)s->m * (size_t)s->n; }

/* The operands of s, from a seed of their own, in device memory. */
typedef struct operands {
    float *a, *b, *c;
} operands;

static bool operands_make(mt_device *dev, const shape *s, uint64_t seed, operands *o) {
    size_t na = (size_t)s->m * (size_t)s->k, nb = (size_t)s->k * (size_t)s->n;
    memset(o, 0, sizeof *o);
    CHECK_OK(mt_device_alloc(dev, na * sizeof(float), MT_MEM_OTHER, (void **)&o->a));
    CHECK_OK(mt_device_alloc(dev, nb * sizeof(float), MT_MEM_OTHER, (void **)&o->b));
    CHECK_OK(mt_device_alloc(dev, out_floats(s) * sizeof(float), MT_MEM_OTHER, (void **)&o->c));
    if (!o->a || !o->b || !o->c) return false;
    float *a = test_lcg_floats(&seed, na, 1.0), *b = test_lcg_floats(&seed, nb, 1.0);
    memcpy(o->a, a, na * sizeof(float));
    memcpy(o->b, b, nb * sizeof(float));
    free(a);
    free(b);
    return true;
}

static void operands_free(mt_device *dev, operands *o) {
    mt_device_free(dev, o->a);
    mt_device_free(dev, o->b);
    mt_device_free(dev, o->c);
}

static mt_status product(mt_device *dev, const shape *s, const operands *o) {
    return mt_op_gemm(dev, s->ta, s->tb, s->m, s->n, s->k, 1.0f, o->a, o->b, 0.0f, o->c);
}

static size_t differ(const float *x, const float *y, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&x[i], &y[i], sizeof *x) != 0;
    return bad;
}

static bool write_all(int fd, const void *p, size_t bytes) {
    const char *c = p;
    while (bytes) {
        ssize_t w = write(fd, c, bytes);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        c += w, bytes -= (size_t)w;
    }
    return true;
}

/* The child: small shape `which` first, the large one, the small one again; sends the first
 * small product and the large one down fd. */
static int child(int which, int fd) {
    const shape *s = &small_shapes[which];
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return check_report("test_gemm_pool_first child");
    openblas_set_num_threads(4);
    /* A sequential OpenBLAS (openblas_get_parallel 0) has no threads to run a product on: the
     * order of the pool and the first product cannot matter there, the bits are still checked. */
    if (openblas_get_parallel() != 0)
        CHECK_MSG(openblas_get_num_threads() > 1, "OpenBLAS runs %d thread(s) before the first "
                  "product (4 were asked for): this case cannot tell a product on OpenBLAS's "
                  "threads from one on the pool", openblas_get_num_threads());
    operands sm, lg;
    size_t n = out_floats(s), nl = out_floats(&large_shape);
    float *first = malloc(n * sizeof *first), *want = malloc(n * sizeof *want);
    if (operands_make(dev, s, 0x5eed0 + (uint64_t)which, &sm) &&
        operands_make(dev, &large_shape, 0x1a26e, &lg) && first && want) {
        CHECK_OK(product(dev, s, &sm));
        memcpy(first, sm.c, n * sizeof *first);
        CHECK_MSG(openblas_get_num_threads() == 1, "OpenBLAS runs %d threads after the first "
                  "product: the pool did not set it to one", openblas_get_num_threads());
        CHECK_OK(product(dev, &large_shape, &lg));
        memset(sm.c, 0xff, n * sizeof(float)); /* NaNs: the second product must write it all */
        CHECK_OK(product(dev, s, &sm));
        cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                    s->tb ? CblasTrans : CblasNoTrans, s->m, s->n, s->k, 1.0f, sm.a,
                    s->ta ? s->m : s->k, sm.b, s->tb ? s->k : s->n, 0.0f, want, s->n);
        size_t bad_first = differ(first, want, n), bad_again = differ(sm.c, want, n);
        CHECK_MSG(bad_first == 0, "shape %d (%dx%dx%d): the product issued before the pool "
                  "existed differs from one single-threaded sgemm in %zu of %zu elements", which,
                  s->m, s->n, s->k, bad_first, n);
        CHECK_MSG(bad_again == 0, "shape %d: the product issued after the pool differs from one "
                  "single-threaded sgemm in %zu of %zu elements", which, bad_again, n);
        CHECK(write_all(fd, first, n * sizeof(float)));
        CHECK(write_all(fd, lg.c, nl * sizeof(float)));
    } else {
        CHECK_MSG(false, "out of memory for the operands");
    }
    free(first);
    free(want);
    operands_free(dev, &sm);
    operands_free(dev, &lg);
    mt_device_close(dev);
    return check_report("test_gemm_pool_first child");
}

/* Runs the child for small shape `which` on a pool of `threads`; returns the floats it sent
 * (the small product, then the large one) or NULL. */
static float *run_child(const char *self, int which, int threads) {
    size_t n = out_floats(&small_shapes[which]) + out_floats(&large_shape);
    int fds[2];
    if (pipe(fds) != 0) {
        CHECK_MSG(false, "pipe: %s", strerror(errno));
        return NULL;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        char t[16], w[16], fd[16];
        snprintf(t, sizeof t, "%d", threads);
        snprintf(w, sizeof w, "%d", which);
        snprintf(fd, sizeof fd, "%d", fds[1]);
        setenv("MT_NUM_THREADS", t, 1);
        execl(self, self, "--child", w, fd, (char *)NULL);
        fprintf(stderr, "exec %s: %s\n", self, strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    CHECK_MSG(pid > 0, "fork: %s", strerror(errno));
    float *all = malloc(n * sizeof *all);
    char *p = (char *)all;
    size_t left = all && pid > 0 ? n * sizeof *all : 0;
    while (left) {
        ssize_t got = read(fds[0], p, left);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        p += got, left -= (size_t)got;
    }
    close(fds[0]);
    int status = 0;
    if (pid > 0) CHECK(waitpid(pid, &status, 0) == pid);
    bool ok = pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && left == 0 && all;
    CHECK_MSG(ok, "child (shape %d, %d threads) failed or sent %zu bytes short", which, threads,
              left);
    if (!ok) {
        free(all);
        return NULL;
    }
    return all;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--child") == 0)
        return child(atoi(argv[2]), atoi(argv[3]));
    for (int s = 0; s < N_SMALL; s++) {
        size_t ns = out_floats(&small_shapes[s]), nl = out_floats(&large_shape);
        float *base = NULL;
        for (int p = 0; p < N_POOLS; p++) {
            float *got = run_child("/proc/self/exe", s, pool_sizes[p]);
            if (!got) continue;
            if (!base) {
                base = got;
                continue;
            }
            size_t bad_s = differ(got, base, ns), bad_l = differ(got + ns, base + ns, nl);
            CHECK_MSG(bad_s == 0 && bad_l == 0, "shape %d, %d threads: %zu small and %zu large "
                      "elements differ from the 1-thread pool's", s, pool_sizes[p], bad_s, bad_l);
            free(got);
        }
        free(base);
    }
    return check_report("test_gemm_pool_first");
}
