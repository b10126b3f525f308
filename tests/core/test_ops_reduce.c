/* The reductions of gradient clipping on the CPU device (core/cpu/ops_reduce.c through
 * core/ops.c): mt_op_sum_squares against a long double reference summed in another order, and
 * bit for bit against its fixed chunked order written plainly (the same bits on any thread
 * count; tests/core/test_cpu_ops_threads.c runs it on 1, 2, 3 and 7), accumulation over several calls into one device double, NaN and
 * infinity, mt_op_scale bit for bit, and the argument checks. */
#include "check.h"
#include "numeric.h"

#include "core/cpu/parallel.h"

#include <meshtrain/device.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x5eed0fc11bULL;

static float *rnd_vec(size_t n, double scale) { return test_lcg_floats(&rng_state, n, scale); }

/* The op's order (any thread count must give these bits). */
static double chunked_sum(double start, const float *x, size_t n) {
    return test_chunked_sum_squares(start, x, n, MT_CPU_ELEM_GRAIN);
}

/* An independent reference: pairwise, in long double. */
static long double pairwise(const float *x, size_t n) {
    if (n == 0) return 0.0L;
    if (n == 1) return (long double)x[0] * (long double)x[0];
    return pairwise(x, n / 2) + pairwise(x + n / 2, n - n / 2);
}

/* The accumulator lives in device memory (on the CPU device, host memory behind the device's
 * accounting); it is read back with mt_device_copy as a caller on a GPU would. */
static double *new_acc(mt_device *dev, double start) {
    double *acc = NULL;
    CHECK_OK(mt_device_alloc(dev, sizeof *acc, MT_MEM_OTHER, (void **)&acc));
    if (!acc) abort();
    CHECK_OK(mt_device_copy(dev, acc, &start, sizeof start, MT_COPY_HOST_TO_DEVICE, NULL));
    return acc;
}

static double read_acc(mt_device *dev, const double *acc) {
    double v = -1.0;
    CHECK_OK(mt_device_copy(dev, &v, acc, sizeof v, MT_COPY_DEVICE_TO_HOST, NULL));
    return v;
}

static void test_sum_squares_sizes(mt_device *dev) {
    /* 65537: 5 chunks, the last of 1 element; 2^22 + 5: more chunks than the op keeps on its
     * stack (256), so the partials come from the heap. */
    const size_t sizes[] = {0, 1, 2, 7, 31, 1001, 65537, ((size_t)1 << 22) + 5};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *x = rnd_vec(n, 3.0);
        double *acc = new_acc(dev, 0.0);
        CHECK_OK(mt_op_sum_squares(dev, x, n, acc));
        double got = read_acc(dev, acc);
        long double want = pairwise(x, n);
        double err = fabs(got - (double)want) / (want > 0 ? (double)want : 1.0);
        /* Every term is >= 0, so no cancellation: n * 2^-53 bounds the running sum's error. */
        CHECK_MSG(err <= 1e-12, "n %zu: got %.17g want %.17Lg (rel err %.3g)", n, got, want, err);
        CHECK_MSG(got == chunked_sum(0.0, x, n), "n %zu: %.17g is not the chunked sum "
                  "%.17g bit for bit", n, got, chunked_sum(0.0, x, n));
        mt_device_free(dev, acc);
        free(x);
    }
    /* Integers: every order gives the exact sum, so a lost or doubled element shows. */
    size_t n = 100003;
    float *x = malloc(n * sizeof *x);
    if (!x) abort();
    for (size_t i = 0; i < n; i++) x[i] = (float)((int)(i % 7) - 3);
    double want = 0.0;
    for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
    double *acc = new_acc(dev, 0.0);
    CHECK_OK(mt_op_sum_squares(dev, x, n, acc));
    CHECK_MSG(read_acc(dev, acc) == want, "integers: %.17g, want %.17g", read_acc(dev, acc), want);
    mt_device_free(dev, acc);
    free(x);
}

/* Several calls add into one accumulator, which also keeps what it held before the first. */
static void test_accumulate(mt_device *dev) {
    const size_t n = 10007;
    float *x = rnd_vec(n, 1.0);
    const size_t cuts[] = {0, 1, 1, 500, 4096, 9000, n}; /* one empty piece (1, 1) */
    double start = 2.5;
    double *acc = new_acc(dev, start);
    double expect = start;
    for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++) {
        size_t b = cuts[c], e = cuts[c + 1];
        CHECK_OK(mt_op_sum_squares(dev, x + b, e - b, acc));
        expect = chunked_sum(expect, x + b, e - b);
    }
    double got = read_acc(dev, acc);
    CHECK_MSG(got == expect, "pieces: %.17g, want %.17g", got, expect);
    long double ref = start + pairwise(x, n);
    CHECK(fabs(got - (double)ref) <= 1e-12 * (double)ref);
    /* n 0 leaves the accumulator alone, even with no input buffer. */
    CHECK_OK(mt_op_sum_squares(dev, NULL, 0, acc));
    CHECK(read_acc(dev, acc) == got);
    mt_device_free(dev, acc);
    free(x);
}

static void test_non_finite(mt_device *dev) {
    float x[5] = {1.0f, 2.0f, NAN, 3.0f, 4.0f};
    double *acc = new_acc(dev, 0.0);
    CHECK_OK(mt_op_sum_squares(dev, x, 5, acc));
    CHECK(isnan(read_acc(dev, acc)));
    mt_device_free(dev, acc);
    x[2] = -INFINITY;
    acc = new_acc(dev, 0.0);
    CHECK_OK(mt_op_sum_squares(dev, x, 5, acc));
    double v = read_acc(dev, acc);
    CHECK(isinf(v) && v > 0);
    mt_device_free(dev, acc);
    /* FLT_MAX squared overflows f32 but not the double sum. */
    float big[2] = {3.4e38f, -3.4e38f};
    acc = new_acc(dev, 0.0);
    CHECK_OK(mt_op_sum_squares(dev, big, 2, acc));
    v = read_acc(dev, acc);
    CHECK(isfinite(v) && fabs(v - 2.0 * 3.4e38 * 3.4e38) <= 1e-6 * v);
    mt_device_free(dev, acc);
}

static void test_scale(mt_device *dev) {
    const size_t sizes[] = {0, 1, 9, 4099};
    const float factors[] = {0.37f, -2.5f, 0.0f, 1.0f, 1e-30f};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        for (size_t f = 0; f < sizeof factors / sizeof factors[0]; f++) {
            size_t n = sizes[s];
            float *x = rnd_vec(n, 10.0), *want = malloc((n ? n : 1) * sizeof *want);
            if (!want) abort();
            for (size_t i = 0; i < n; i++) want[i] = x[i] * factors[f];
            CHECK_OK(mt_op_scale(dev, x, factors[f], n));
            CHECK_MSG(n == 0 || memcmp(x, want, n * sizeof *x) == 0,
                      "scale n %zu by %g differs from x[i] * factor", n, (double)factors[f]);
            free(x);
            free(want);
        }
    }
    /* Only [0, n) changes. */
    float y[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    CHECK_OK(mt_op_scale(dev, y, 0.5f, 3));
    CHECK(y[0] == 0.5f && y[1] == 1.0f && y[2] == 1.5f && y[3] == 4.0f);
    CHECK_OK(mt_op_scale(dev, NULL, 2.0f, 0));
    float z[2] = {INFINITY, NAN};
    CHECK_OK(mt_op_scale(dev, z, 0.5f, 2));
    CHECK(isinf(z[0]) && isnan(z[1]));
}

static void test_checks(mt_device *dev) {
    float x[3] = {1, 2, 3};
    double *acc = new_acc(dev, 0.0);
    CHECK(mt_op_sum_squares(NULL, x, 3, acc) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_sum_squares(dev, NULL, 3, acc) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "sum_squares") != NULL);
    CHECK(mt_op_sum_squares(dev, x, 3, NULL) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "accumulator") != NULL);
    /* The accumulator is required even for n 0: it is one double, not n elements. */
    CHECK(mt_op_sum_squares(dev, x, 0, NULL) == MT_ERR_INVALID_ARG);
    CHECK(read_acc(dev, acc) == 0.0); /* refused calls did not touch it */
    CHECK(mt_op_scale(NULL, x, 2.0f, 3) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_scale(dev, NULL, 2.0f, 3) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "scale") != NULL);
    CHECK(x[0] == 1 && x[1] == 2 && x[2] == 3);
    mt_device_free(dev, acc);
}

int main(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return check_report("test_ops_reduce");
    test_sum_squares_sizes(dev);
    test_accumulate(dev);
    test_non_finite(dev);
    test_scale(dev);
    test_checks(dev);
    mt_mem_stats ms;
    mt_device_mem_stats(dev, &ms);
    CHECK(ms.total_current == 0); /* every accumulator was freed */
    mt_device_close(dev);
    return check_report("test_ops_reduce");
}
