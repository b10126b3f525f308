/* The elementwise ops a model author composes (core/cpu/ops_elementwise.c, core/cpu/ops_cpu.c):
 * relu, tanh, sigmoid and silu forward against a double-precision reference, backward against
 * central finite differences of that reference, on sizes 0, 1, 7 and 1029 with saturating inputs
 * (+-20, +-100) that must give finite values; the product and its backward (with either gradient
 * absent, and d_a == d_b for a * a); the gradient buffers prefilled so that backward is seen to
 * accumulate; NULL-argument errors; mt_device_compute_stream on the CPU device. */
#include "check.h"
#include "numeric.h"

#include <meshtrain/device.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0xe1e3e47ULL;

static const size_t sizes[] = {0, 1, 7, 1029};
enum { N_SIZES = sizeof sizes / sizeof sizes[0] };

/* Inputs in [-6, 6), with saturating values at the front when there is room. */
static float *inputs(size_t n) {
    float *x = test_lcg_floats(&rng_state, n, 6.0);
    static const float extremes[] = {20.0f, -20.0f, 100.0f, -100.0f, 1e-30f};
    if (n > 2 * (sizeof extremes / sizeof extremes[0]))
        memcpy(x, extremes, sizeof extremes);
    return x;
}

/* Counts elements of got (minus base) off want[i] beyond the tolerance, printing the first. */
static int count_off(const char *what, const float *got, const float *base, const double *want,
                     size_t n, double rel, double abs_tol) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double g = (double)got[i] - (base ? (double)base[i] : 0.0);
        if (!test_close_to(g, want[i], rel, abs_tol)) {
            if (!bad) fprintf(stderr, "  %s [%zu]: got %.9g want %.9g\n", what, i, g, want[i]);
            bad++;
        }
    }
    return bad;
}

/* d f / d x by a central difference of the double reference. */
static double central_diff(double (*f)(double), double x) {
    const double h = 1e-6;
    return (f(x + h) - f(x - h)) / (2.0 * h);
}

/* ---- activations ----------------------------------------------------------------------------- */

static double relu_ref(double x) { return x > 0.0 ? x : 0.0; }
static double tanh_ref(double x) { return tanh(x); }
static double sigmoid_ref(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu_ref(double x) { return x * sigmoid_ref(x); }

typedef mt_status (*forward_fn)(mt_device *, const float *, float *, size_t);
typedef mt_status (*backward_fn)(mt_device *, const float *, const float *, float *, size_t);

typedef struct activation {
    const char *name;
    forward_fn forward;
    backward_fn backward;
    double (*ref)(double);
    bool backward_from_output; /* backward takes the forward output, else the input */
} activation;

static const activation activations[] = {
    {"relu", mt_op_relu_forward, mt_op_relu_backward, relu_ref, true},
    {"tanh", mt_op_tanh_forward, mt_op_tanh_backward, tanh_ref, true},
    {"sigmoid", mt_op_sigmoid_forward, mt_op_sigmoid_backward, sigmoid_ref, true},
    {"silu", mt_op_silu_forward, mt_op_silu_backward, silu_ref, false},
};

static void test_activation(mt_device *dev, const activation *a, size_t n) {
    float *x = inputs(n), *y = malloc((n ? n : 1) * sizeof *y);
    float *d_out = test_lcg_floats(&rng_state, n, 1.0), *d_in = test_lcg_floats(&rng_state, n, 1.0);
    float *base = test_copy_floats(d_in, n);
    double *want = malloc((n ? n : 1) * sizeof *want);
    if (!y || !want) abort();

    /* Forward: a few float ulps of the double reference; finite everywhere. */
    CHECK_OK(a->forward(dev, x, y, n));
    int nonfinite = 0;
    for (size_t i = 0; i < n; i++) {
        want[i] = a->ref((double)x[i]);
        if (!isfinite(y[i])) nonfinite++;
    }
    CHECK_MSG(count_off(a->name, y, NULL, want, n, 1e-6, 1e-30) == 0, "%s forward, n %zu",
              a->name, n);
    CHECK_MSG(nonfinite == 0, "%s forward, n %zu: %d non-finite outputs", a->name, n, nonfinite);

    /* Backward: d_in - its prefill = f'(x) d_out, f' by finite differences, away from relu's
     * kink at 0 (where the difference quotient is 1/2). */
    CHECK_OK(a->backward(dev, a->backward_from_output ? y : x, d_out, d_in, n));
    size_t checked = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs((double)x[i]) < 1e-3) {
            want[i] = (double)d_in[i] - (double)base[i]; /* not compared */
            continue;
        }
        want[i] = central_diff(a->ref, (double)x[i]) * (double)d_out[i];
        checked++;
    }
    CHECK_MSG(count_off(a->name, d_in, base, want, n, 1e-5, 1e-6) == 0,
              "%s backward, n %zu (%zu elements against finite differences)", a->name, n, checked);

    /* In place forward gives the same bits. */
    float *x2 = test_copy_floats(x, n);
    CHECK_OK(a->forward(dev, x2, x2, n));
    CHECK_MSG(n == 0 || memcmp(x2, y, n * sizeof *y) == 0, "%s in place, n %zu", a->name, n);
    free(x), free(y), free(d_out), free(d_in), free(base), free(want), free(x2);
}

/* ---- product --------------------------------------------------------------------------------- */

static void test_mul(mt_device *dev, size_t n) {
    float *a = inputs(n), *b = test_lcg_floats(&rng_state, n, 3.0);
    float *out = malloc((n ? n : 1) * sizeof *out), *d_out = test_lcg_floats(&rng_state, n, 1.0);
    float *d_a = test_lcg_floats(&rng_state, n, 1.0), *d_b = test_lcg_floats(&rng_state, n, 1.0);
    float *base_a = test_copy_floats(d_a, n), *base_b = test_copy_floats(d_b, n);
    double *want_a = malloc((n ? n : 1) * sizeof *want_a);
    double *want_b = malloc((n ? n : 1) * sizeof *want_b);
    if (!out || !want_a || !want_b) abort();

    /* The float product of two floats is the correctly rounded double product. */
    CHECK_OK(mt_op_mul(dev, a, b, out, n));
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (out[i] != (float)((double)a[i] * (double)b[i])) bad++;
    CHECK_MSG(bad == 0, "mul forward, n %zu: %d products off", n, bad);

    /* d(a b)/da = b and d(a b)/db = a: the product is linear in each, so the difference quotient
     * of the double product is exact up to rounding. */
    for (size_t i = 0; i < n; i++) {
        double ai = a[i], bi = b[i], h = 1e-3, g = d_out[i];
        want_a[i] = ((ai + h) * bi - (ai - h) * bi) / (2 * h) * g;
        want_b[i] = (ai * (bi + h) - ai * (bi - h)) / (2 * h) * g;
    }
    CHECK_OK(mt_op_mul_backward(dev, a, b, d_out, d_a, d_b, n));
    CHECK_MSG(count_off("mul d_a", d_a, base_a, want_a, n, 1e-6, 1e-6) == 0, "mul d_a, n %zu", n);
    CHECK_MSG(count_off("mul d_b", d_b, base_b, want_b, n, 1e-6, 1e-6) == 0, "mul d_b, n %zu", n);

    /* One gradient wanted: the input only the other would read may be NULL. */
    memcpy(d_a, base_a, n * sizeof *d_a);
    CHECK_OK(mt_op_mul_backward(dev, NULL, b, d_out, d_a, NULL, n));
    CHECK_MSG(count_off("mul d_a only", d_a, base_a, want_a, n, 1e-6, 1e-6) == 0,
              "mul d_a alone, n %zu", n);
    memcpy(d_b, base_b, n * sizeof *d_b);
    CHECK_OK(mt_op_mul_backward(dev, a, NULL, d_out, NULL, d_b, n));
    CHECK_MSG(count_off("mul d_b only", d_b, base_b, want_b, n, 1e-6, 1e-6) == 0,
              "mul d_b alone, n %zu", n);
    CHECK_OK(mt_op_mul_backward(dev, NULL, NULL, d_out, NULL, NULL, n));

    /* a * a with one gradient buffer: 2 a d_out. */
    memcpy(d_a, base_a, n * sizeof *d_a);
    for (size_t i = 0; i < n; i++) want_a[i] = 2.0 * a[i] * d_out[i];
    CHECK_OK(mt_op_mul_backward(dev, a, a, d_out, d_a, d_a, n));
    CHECK_MSG(count_off("mul a*a", d_a, base_a, want_a, n, 1e-6, 1e-6) == 0, "mul a * a, n %zu",
              n);

    /* Output aliasing the first input. */
    CHECK_OK(mt_op_mul(dev, a, b, a, n));
    CHECK_MSG(n == 0 || memcmp(a, out, n * sizeof *a) == 0, "mul aliased, n %zu", n);
    free(a), free(b), free(out), free(d_out), free(d_a), free(d_b), free(base_a), free(base_b);
    free(want_a), free(want_b);
}

/* ---- argument checks ------------------------------------------------------------------------- */

/* A call that must fail with MT_ERR_INVALID_ARG and a message containing both words. */
#define CHECK_INVALID(call, word1, word2)                                                          \
    do {                                                                                           \
        CHECK((call) == MT_ERR_INVALID_ARG);                                                       \
        CHECK_MSG(strstr(mt_last_error(), word1) && strstr(mt_last_error(), word2),                \
                  "message \"%s\" lacks \"%s\" or \"%s\"", mt_last_error(), word1, word2);         \
    } while (0)

static void test_errors(mt_device *dev) {
    float x[4] = {1, 2, 3, 4};
    for (size_t k = 0; k < sizeof activations / sizeof activations[0]; k++) {
        const activation *a = &activations[k];
        CHECK_INVALID(a->forward(NULL, x, x, 4), a->name, "device");
        CHECK_INVALID(a->forward(dev, NULL, x, 4), a->name, "input");
        CHECK_INVALID(a->forward(dev, x, NULL, SIZE_MAX), a->name, "output");
        CHECK_INVALID(a->backward(dev, x, NULL, x, 4), a->name, "output gradient");
        CHECK_INVALID(a->backward(dev, x, x, NULL, 4), a->name, "input gradient");
        CHECK_INVALID(a->backward(dev, NULL, x, x, 4), a->name,
                      a->backward_from_output ? "forward output" : "input");
        /* No elements: NULL buffers are fine. */
        CHECK_OK(a->forward(dev, NULL, NULL, 0));
        CHECK_OK(a->backward(dev, NULL, NULL, NULL, 0));
    }
    CHECK_INVALID(mt_op_mul(NULL, x, x, x, 4), "mul", "device");
    CHECK_INVALID(mt_op_mul(dev, x, NULL, x, 4), "mul", "second input");
    CHECK_INVALID(mt_op_mul(dev, x, x, NULL, 4), "mul", "output");
    CHECK_INVALID(mt_op_mul_backward(dev, x, x, NULL, x, x, 4), "mul_backward", "output gradient");
    CHECK_INVALID(mt_op_mul_backward(dev, x, NULL, x, x, NULL, 4), "mul_backward", "second input");
    CHECK_INVALID(mt_op_mul_backward(dev, NULL, x, x, NULL, x, 4), "mul_backward", "first input");
    CHECK_OK(mt_op_mul_backward(dev, NULL, NULL, NULL, NULL, NULL, 0));
    CHECK(x[0] == 1 && x[3] == 4); /* nothing failed half-way */
}

/* ---- the compute stream ---------------------------------------------------------------------- */

static void test_compute_stream(mt_device *dev) {
    void *stream = (void *)&rng_state;
    CHECK_OK(mt_device_compute_stream(dev, &stream));
    CHECK_MSG(stream == NULL, "the CPU device has no stream");
    CHECK_INVALID(mt_device_compute_stream(NULL, &stream), "compute_stream", "dev");
    CHECK_INVALID(mt_device_compute_stream(dev, NULL), "compute_stream", "cuda_stream");
}

int main(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return check_report("test_ops_elementwise");
    for (int s = 0; s < N_SIZES; s++) {
        for (size_t k = 0; k < sizeof activations / sizeof activations[0]; k++)
            test_activation(dev, &activations[k], sizes[s]);
        test_mul(dev, sizes[s]);
    }
    test_errors(dev);
    test_compute_stream(dev);
    mt_device_close(dev);
    return check_report("test_ops_elementwise");
}
