/* Internal: the GELU kernels and the exp kernel of the softmax and cross-entropy, written once with GCC vector extensions and compiled once per
 * vector width (core/cpu/gelu_{generic,avx2,avx512}.c define MT_GELU_WIDTH and MT_GELU_NAME
 * before including this file). Every lane does the same IEEE single-precision operations in the
 * same order (CMakeLists.txt builds the files with -ffp-contract=off), so all widths give the
 * same bits and the choice of path by CPU never changes a result.
 *
 * tanh is the cost of GELU: libm's tanhf is a call per element that no loop vectorises. Here
 *   tanh(y) = sign(y) * (1 - e) / (1 + e),  e = exp(-2|y|),
 * with exp from a Cody-Waite reduction (x = n ln2 + r, |r| <= ln2/2) and a degree-7 Taylor
 * polynomial in r (truncation < 2e-9 relative), and for |y| < 1/16, where 1 - e cancels, the odd
 * series y - y^3/3 + 2y^5/15 - 17y^7/315 (truncation < 1e-11 relative). Against double
 * precision over x in [-10, 10], GELU is within 5.2e-7 absolute (libm's tanhf formula: 4.3e-7)
 * and its derivative within 1.0e-6 (libm's: 5.6e-7); tests/core/test_cpu_ops_threads.c holds
 * both to 3e-6 x (1 + |value|) of the tanhf loop. The same exp serves the attention softmax
 * and the cross-entropy (mt_exp_shift): within 2 ulp of exp in double over [-87, 0] (measured
 * by tests/core/test_cpu_ops_threads.c); below -87 it gives exp(-87), about 1.6e-38, where
 * libm gives a smaller subnormal or 0. docs/cpu-kernels.md. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MT_GELU_CAT2(a, b) a##_##b
#define MT_GELU_CAT(a, b) MT_GELU_CAT2(a, b)
#define MT_GELU_FN(name) MT_GELU_CAT(name, MT_GELU_NAME)

typedef float gv_f __attribute__((vector_size(MT_GELU_WIDTH * sizeof(float))));
typedef int32_t gv_i __attribute__((vector_size(MT_GELU_WIDTH * sizeof(float))));

/* a where mask is set, else b (C has no vector ?: in GCC). */
static inline gv_f gv_select(gv_i mask, gv_f a, gv_f b) {
    return (gv_f)(((gv_i)a & mask) | ((gv_i)b & ~mask));
}

/* exp(x) for x <= 0; below -87 (where exp leaves the normal floats) it is exp(-87). */
static inline gv_f gv_exp_nonpos(gv_f x) {
    x = gv_select(x < -87.0f, (gv_f){0} - 87.0f, x);
    /* n = round(x / ln2) by the 1.5 * 2^23 trick: exact for |n| < 2^22. */
    gv_f n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    /* ln2 split so that n * ln2_hi is exact: r carries no rounding from the reduction. */
    gv_f r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    gv_f p = (gv_f){0} + 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    gv_i bits = (__builtin_convertvector(n, gv_i) + 127) << 23;
    return p * (gv_f)bits;
}

static inline gv_f gv_tanh(gv_f y) {
    gv_i sign = (gv_i)y & INT32_MIN;
    gv_f a = (gv_f)((gv_i)y & INT32_MAX);
    gv_f e = gv_exp_nonpos(a * -2.0f);
    gv_f big = (1.0f - e) / (1.0f + e);
    gv_f a2 = a * a;
    gv_f s = (gv_f){0} - 17.0f / 315.0f;
    s = s * a2 + 2.0f / 15.0f;
    s = s * a2 + -1.0f / 3.0f;
    gv_f small = a + a * (a2 * s);
    gv_f t = gv_select(a < 0.0625f, small, big);
    t = (gv_f)((gv_i)t | sign);
    return gv_select(y != y, y, t); /* NaN stays NaN */
}

/* sqrt(2 / pi) and the cubic's coefficient, as the scalar formula (core/cpu/ops_gelu.c). */
#define MT_GELU_K 0.7978845608028654f
#define MT_GELU_C 0.044715f

static inline gv_f gv_gelu(gv_f x) {
    gv_f th = gv_tanh(MT_GELU_K * (x + MT_GELU_C * x * x * x));
    return 0.5f * x * (1.0f + th);
}

static inline gv_f gv_gelu_grad(gv_f x) {
    gv_f th = gv_tanh(MT_GELU_K * (x + MT_GELU_C * x * x * x));
    /* sech^2 as 1 - tanh^2: cosh overflows for large |x|, tanh saturates cleanly. */
    gv_f sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * MT_GELU_K * (1.0f + 3.0f * MT_GELU_C * x * x);
}

void MT_GELU_FN(mt_gelu_forward)(const float *in, float *out, size_t n) {
    size_t i = 0;
    for (; i + MT_GELU_WIDTH <= n; i += MT_GELU_WIDTH) {
        gv_f x;
        memcpy(&x, in + i, sizeof x);
        x = gv_gelu(x);
        memcpy(out + i, &x, sizeof x);
    }
    if (i == n) return;
    gv_f x = {0};
    memcpy(&x, in + i, (n - i) * sizeof(float));
    x = gv_gelu(x);
    memcpy(out + i, &x, (n - i) * sizeof(float));
}

/* overwrite: d_in starts from 0 (it is not read), so the result is 0 + gelu'(x) dy, the bits of
 * adding into zeros. */
void MT_GELU_FN(mt_gelu_backward)(const float *in, const float *d_out, float *d_in, size_t n,
                                  bool overwrite) {
    size_t i = 0;
    for (; i + MT_GELU_WIDTH <= n; i += MT_GELU_WIDTH) {
        gv_f x, dy, dx = {0};
        memcpy(&x, in + i, sizeof x);
        memcpy(&dy, d_out + i, sizeof dy);
        if (!overwrite) memcpy(&dx, d_in + i, sizeof dx);
        dx += gv_gelu_grad(x) * dy;
        memcpy(d_in + i, &dx, sizeof dx);
    }
    if (i == n) return;
    size_t rest = (n - i) * sizeof(float);
    gv_f x = {0}, dy = {0}, dx = {0};
    memcpy(&x, in + i, rest);
    memcpy(&dy, d_out + i, rest);
    if (!overwrite) memcpy(&dx, d_in + i, rest);
    dx += gv_gelu_grad(x) * dy;
    memcpy(d_in + i, &dx, rest);
}

/* out[i] = exp(x[i] - shift) for x[i] <= shift (the softmax's and the cross-entropy's
 * exponentials; core/cpu/exp_kernels.h). */
void MT_GELU_FN(mt_exp_shift)(const float *x, float shift, float *out, size_t n) {
    size_t i = 0;
    for (; i + MT_GELU_WIDTH <= n; i += MT_GELU_WIDTH) {
        gv_f v;
        memcpy(&v, x + i, sizeof v);
        v = gv_exp_nonpos(v - shift);
        memcpy(out + i, &v, sizeof v);
    }
    if (i == n) return;
    gv_f v = (gv_f){0} + shift; /* lanes past n compute exp(0) and are dropped */
    memcpy(&v, x + i, (n - i) * sizeof(float));
    v = gv_exp_nonpos(v - shift);
    memcpy(out + i, &v, (n - i) * sizeof(float));
}
