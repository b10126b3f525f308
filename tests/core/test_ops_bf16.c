/* The bf16 matrix products on the CPU device (mt_op_gemm_ex, mt_op_linear_forward_ex,
 * mt_op_linear_backward_ex): with bf16 they must compute what the f32 ops compute on the same
 * operands rounded to bf16 first (round to nearest even, as mt_f32_to_bf16), accumulate as the
 * f32 ops do, leave the bias gradient unrounded, free their scratch (charged to activations),
 * also when an allocation fails; with f32 they must be the f32 ops bit for bit. Both paths of
 * core/cpu/bf16_gemm_path.h are checked: ctest runs this program with MT_CPU_BF16_GEMM unset,
 * =f32 and =onednn (tests/core/ops_dispatch.cmake); the oneDNN path sums in another order (TOL
 * covers it) and counts bf16 denormals as zero (AVX512-BF16's dot products do). */
#include "check.h"
#include "numeric.h"

#include "core/cpu/bf16_gemm_path.h"
#include "core/cpu/cpu_features.h"
#include "core/cpu/gemm_dnnl.h"

#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Relative agreement of products of the same bf16 values, both accumulated in f32 by sgemm. */
#define TOL 1e-6

static uint64_t rng = 0x243f6a8885a308d3ull;

/* The path the products take in this process. */
static bool on_onednn(void) {
    mt_bf16_gemm_path path = MT_BF16_GEMM_F32;
    CHECK_OK(mt_cpu_bf16_gemm_path(&path, false));
    return path == MT_BF16_GEMM_ONEDNN;
}

static float *rand_floats(size_t n) { return test_rand_floats(&rng, n, -1.0f, 1.0f); }

/* The bf16 copy of src (rounded as mt_f32_to_bf16) and, in *widened, those values as f32. */
static mt_bf16 *to_bf16(const float *src, size_t n, float **widened) {
    mt_bf16 *b = malloc((n ? n : 1) * sizeof *b);
    float *w = malloc((n ? n : 1) * sizeof *w);
    if (!b || !w) abort();
    for (size_t i = 0; i < n; i++) {
        b[i] = mt_f32_to_bf16(src[i]);
        w[i] = mt_bf16_to_f32(b[i]);
    }
    *widened = w;
    return b;
}

/* Largest |got - want| / max(|want|, 1), printed and checked against tol. */
static void agree(const char *what, const float *got, const float *want, size_t n, double tol) {
    size_t at;
    double worst = test_max_rel_err(got, want, n, &at);
    printf("  %-40s n %-6zu max rel err %.3g\n", what, n, worst);
    CHECK_MSG(worst <= tol, "%s: element %zu: %.9g vs %.9g (err %.3g > %.1g)", what, at,
              n ? (double)got[at] : 0.0, n ? (double)want[at] : 0.0, worst, tol);
}

static bool differs(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return true;
    return false;
}

static mt_mem_stats stats(mt_device *dev) {
    mt_mem_stats s;
    mt_device_mem_stats(dev, &s);
    return s;
}

static void test_gemm(mt_device *dev) {
    const int m = 37, n = 53, k = 29;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            float *a = rand_floats((size_t)m * k), *b = rand_floats((size_t)k * n), *fa, *fb;
            mt_bf16 *ba = to_bf16(a, (size_t)m * k, &fa), *bb = to_bf16(b, (size_t)k * n, &fb);
            float *c = rand_floats((size_t)m * n), *ref = test_copy_floats(c, (size_t)m * n);
            CHECK_OK(mt_op_gemm_ex(dev, ta, tb, m, n, k, 0.7f, ba, bb, MT_BF16, 0.5f, c));
            CHECK_OK(mt_op_gemm(dev, ta, tb, m, n, k, 0.7f, fa, fb, 0.5f, ref));
            char what[64];
            snprintf(what, sizeof what, "gemm_ex bf16 trans_a %d trans_b %d", ta, tb);
            agree(what, c, ref, (size_t)m * n, TOL);
            /* f32: mt_op_gemm bit for bit. */
            float *c32 = rand_floats((size_t)m * n), *ref32 = test_copy_floats(c32, (size_t)m * n);
            CHECK_OK(mt_op_gemm_ex(dev, ta, tb, m, n, k, 0.7f, a, b, MT_F32, 0.5f, c32));
            CHECK_OK(mt_op_gemm(dev, ta, tb, m, n, k, 0.7f, a, b, 0.5f, ref32));
            CHECK(memcmp(c32, ref32, (size_t)m * n * sizeof *c32) == 0);
            free(a), free(b), free(fa), free(fb), free(ba), free(bb), free(c), free(ref);
            free(c32), free(ref32);
        }
    /* k = 0: only beta applies; beta = 0 clears even NaN. m = 0: nothing, not even a pointer. */
    float c[6] = {1, 2, NAN, 4, 5, 6};
    CHECK_OK(mt_op_gemm_ex(dev, false, false, 2, 3, 0, 1.0f, NULL, NULL, MT_BF16, 0.0f, c));
    int nonzero = 0;
    for (int i = 0; i < 6; i++) nonzero += c[i] != 0.0f;
    CHECK_MSG(nonzero == 0, "%d elements survived beta 0 with k 0", nonzero);
    mt_bf16 bz[12] = {0};
    CHECK_OK(mt_op_gemm_ex(dev, false, false, 0, 3, 4, 1.0f, NULL, bz, MT_BF16, 0.0f, NULL));
}

/* Exact ties between two bf16 values must go to the even one: 1 + 3 * 2^-8 lies halfway between
 * 1 + 2^-7 (odd) and 1 + 2^-6 (even), so truncation and round-half-up would both be wrong for
 * one of these. A 1 x 1 linear with weight 1 shows the rounded input. */
static void test_input_rounding(mt_device *dev) {
    const float ins[] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -1.0f - 3.0f / 256,
                         1.0f + 5.0f / 256, 3.14159265f, -2.71828183e-3f, 65504.0f, 1e-40f};
    mt_bf16 one = mt_f32_to_bf16(1.0f);
    int wrong = 0;
    for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++) {
        float out = NAN;
        CHECK_OK(mt_op_linear_forward_ex(dev, &ins[i], &one, MT_BF16, NULL, &out, 1, 1, 1));
        float want = mt_bf16_to_f32(mt_f32_to_bf16(ins[i]));
        /* oneDNN's bf16 kernels take a denormal operand as zero: 1e-40 gives 0 there. */
        if (on_onednn() && fabsf(want) < 0x1p-126f) want = 0.0f;
        if (memcmp(&out, &want, sizeof out) != 0) {
            wrong++;
            fprintf(stderr, "  input %.9g: got %.9g, mt_f32_to_bf16 gives %.9g\n", (double)ins[i],
                    (double)out, (double)want);
        }
    }
    CHECK_MSG(wrong == 0, "%d inputs rounded differently from mt_f32_to_bf16", wrong);
}

static void test_linear(mt_device *dev) {
    const int batch = 13, in = 31, out = 17;
    size_t ni = (size_t)batch * in, no = (size_t)batch * out, nw = (size_t)out * in;
    float *x = rand_floats(ni), *w = rand_floats(nw), *bias = rand_floats((size_t)out);
    float *x_r, *w_r;
    mt_bf16 *xb = to_bf16(x, ni, &x_r), *wb = to_bf16(w, nw, &w_r);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        const float *b = with_bias ? bias : NULL;
        float *y = rand_floats(no), *ref = rand_floats(no), *plain = rand_floats(no);
        CHECK_OK(mt_op_linear_forward_ex(dev, x, wb, MT_BF16, b, y, batch, in, out));
        CHECK_OK(mt_op_linear_forward(dev, x_r, w_r, b, ref, batch, in, out));
        agree(with_bias ? "linear_forward_ex bf16 bias" : "linear_forward_ex bf16", y, ref, no,
              TOL);
        /* The input was rounded: the product on the unrounded input is another one. */
        CHECK_OK(mt_op_linear_forward(dev, x, w_r, b, plain, batch, in, out));
        CHECK_MSG(differs(y, plain, no), "linear_forward_ex bf16 did not round its input");
        /* f32: mt_op_linear_forward bit for bit. */
        CHECK_OK(mt_op_linear_forward_ex(dev, x, w, MT_F32, b, y, batch, in, out));
        CHECK_OK(mt_op_linear_forward(dev, x, w, b, ref, batch, in, out));
        CHECK(memcmp(y, ref, no * sizeof *y) == 0);
        free(y), free(ref), free(plain);
    }

    float *dy = rand_floats(no), *dy_r;
    mt_bf16 *dyb = to_bf16(dy, no, &dy_r);
    for (int full = 0; full < 2; full++) {
        /* Random starting gradients: the op adds onto them. */
        float *dx = rand_floats(ni), *dw = rand_floats(nw), *db = rand_floats((size_t)out);
        float *rdx = test_copy_floats(dx, ni), *rdw = test_copy_floats(dw, nw);
        float *rdb = test_copy_floats(db, (size_t)out);
        CHECK_OK(mt_op_linear_backward_ex(dev, dy, x, wb, MT_BF16, full ? dx : NULL, dw,
                                          full ? db : NULL, batch, in, out));
        CHECK_OK(mt_op_linear_backward(dev, dy_r, x_r, w_r, full ? rdx : NULL, rdw, NULL, batch,
                                       in, out));
        /* The bias gradient sums the unrounded gradient, rows in order. */
        if (full)
            for (int r = 0; r < batch; r++)
                for (int j = 0; j < out; j++) rdb[j] += dy[(size_t)r * out + j];
        agree(full ? "linear_backward_ex bf16 d_in" : "linear_backward_ex bf16 d_in (NULL)", dx,
              rdx, ni, TOL);
        agree("linear_backward_ex bf16 d_w", dw, rdw, nw, TOL);
        agree("linear_backward_ex bf16 d_bias", db, rdb, (size_t)out, 0.0);
        free(dx), free(dw), free(db), free(rdx), free(rdw), free(rdb);
    }

    /* Accumulation: two backward passes from zero give twice one pass's gradients. */
    float *dx1 = calloc(ni, sizeof(float)), *dw1 = calloc(nw, sizeof(float));
    float *db1 = calloc((size_t)out, sizeof(float));
    float *dx2 = calloc(ni, sizeof(float)), *dw2 = calloc(nw, sizeof(float));
    float *db2 = calloc((size_t)out, sizeof(float));
    if (!dx1 || !dw1 || !db1 || !dx2 || !dw2 || !db2) abort();
    CHECK_OK(mt_op_linear_backward_ex(dev, dy, x, wb, MT_BF16, dx1, dw1, db1, batch, in, out));
    for (int t = 0; t < 2; t++)
        CHECK_OK(mt_op_linear_backward_ex(dev, dy, x, wb, MT_BF16, dx2, dw2, db2, batch, in,
                                          out));
    for (size_t i = 0; i < ni; i++) dx1[i] *= 2.0f;
    for (size_t i = 0; i < nw; i++) dw1[i] *= 2.0f;
    for (int j = 0; j < out; j++) db1[j] *= 2.0f;
    agree("linear_backward_ex bf16 twice d_in", dx2, dx1, ni, TOL);
    agree("linear_backward_ex bf16 twice d_w", dw2, dw1, nw, TOL);
    agree("linear_backward_ex bf16 twice d_bias", db2, db1, (size_t)out, TOL);

    /* f32: mt_op_linear_backward bit for bit. */
    float *fdx = rand_floats(ni), *fdw = rand_floats(nw), *fdb = rand_floats((size_t)out);
    float *gdx = test_copy_floats(fdx, ni), *gdw = test_copy_floats(fdw, nw);
    float *gdb = test_copy_floats(fdb, (size_t)out);
    CHECK_OK(mt_op_linear_backward_ex(dev, dy, x, w, MT_F32, fdx, fdw, fdb, batch, in, out));
    CHECK_OK(mt_op_linear_backward(dev, dy, x, w, gdx, gdw, gdb, batch, in, out));
    CHECK(memcmp(fdx, gdx, ni * sizeof *fdx) == 0);
    CHECK(memcmp(fdw, gdw, nw * sizeof *fdw) == 0);
    CHECK(memcmp(fdb, gdb, (size_t)out * sizeof *fdb) == 0);

    free(x), free(w), free(bias), free(x_r), free(w_r), free(xb), free(wb);
    free(dy), free(dy_r), free(dyb);
    free(dx1), free(dw1), free(db1), free(dx2), free(dw2), free(db2);
    free(fdx), free(fdw), free(fdb), free(gdx), free(gdw), free(gdb);
}

static void test_errors(mt_device *dev) {
    float a[4] = {0}, c[4] = {0};
    mt_dtype bad[] = {MT_DTYPE_COUNT, (mt_dtype)99};
    for (int i = 0; i < 2; i++) {
        CHECK(mt_op_gemm_ex(dev, false, false, 2, 2, 1, 1.0f, a, a, bad[i], 0.0f, c) ==
              MT_ERR_INVALID_ARG);
        CHECK(strstr(mt_last_error(), "gemm_ex") != NULL);
        CHECK(mt_op_linear_forward_ex(dev, a, a, bad[i], NULL, c, 2, 2, 2) ==
              MT_ERR_INVALID_ARG);
        CHECK(strstr(mt_last_error(), "linear_forward_ex") != NULL);
        CHECK(mt_op_linear_backward_ex(dev, a, a, a, bad[i], NULL, c, NULL, 2, 2, 2) ==
              MT_ERR_INVALID_ARG);
        CHECK(strstr(mt_last_error(), "linear_backward_ex") != NULL);
    }
    CHECK(mt_op_gemm_ex(dev, false, false, 2, 2, 1, 1.0f, NULL, a, MT_BF16, 0.0f, c) ==
          MT_ERR_INVALID_ARG);
    CHECK(mt_op_gemm_ex(dev, false, false, -1, 2, 1, 1.0f, a, a, MT_BF16, 0.0f, c) ==
          MT_ERR_INVALID_ARG);
    CHECK(mt_op_linear_forward_ex(NULL, a, a, MT_BF16, NULL, c, 2, 2, 2) == MT_ERR_INVALID_ARG);
}

/* oneDNN: the primitives are made by the first call of a shape and kept; the same products
 * again make none (a primitive costs milliseconds to make). */
static void test_primitives_kept(mt_device *dev) {
    if (!on_onednn()) return;
    const int batch = 40, in = 96, out = 160;
    size_t ni = (size_t)batch * in, no = (size_t)batch * out, nw = (size_t)out * in;
    float *x = rand_floats(ni), *w = rand_floats(nw), *y = rand_floats(no), *w_r;
    float *dx = rand_floats(ni), *dw = rand_floats(nw);
    mt_bf16 *wb = to_bf16(w, nw, &w_r);
    size_t before = mt_cpu_dnnl_primitives(), after_first = 0;
    for (int round = 0; round < 3; round++) {
        CHECK_OK(mt_op_linear_forward_ex(dev, x, wb, MT_BF16, NULL, y, batch, in, out));
        CHECK_OK(mt_op_linear_backward_ex(dev, y, x, wb, MT_BF16, dx, dw, NULL, batch, in, out));
        if (round == 0) after_first = mt_cpu_dnnl_primitives();
    }
    size_t after = mt_cpu_dnnl_primitives();
    /* forward, d_in and d_w are three products of different shapes */
    CHECK_MSG(after_first >= before + 3, "%zu primitives after the first round, %zu before",
              after_first, before);
    CHECK_MSG(after == after_first, "%zu primitives after three rounds, %zu after the first",
              after, after_first);
    free(x), free(w), free(y), free(w_r), free(dx), free(dw), free(wb);
}

/* The scratch is charged to activations and gone when the op returns, also when the second of
 * two allocations fails. */
static void test_scratch(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return;
    const int batch = 13, in = 31, out = 17;
    size_t ni = (size_t)batch * in, no = (size_t)batch * out, nw = (size_t)out * in;
    float *x = rand_floats(ni), *w = rand_floats(nw), *y = rand_floats(no), *w_r;
    float *dx = rand_floats(ni), *dw = rand_floats(nw), *db = rand_floats((size_t)out);
    mt_bf16 *wb = to_bf16(w, nw, &w_r);
    mt_mem_stats before = stats(dev);
    CHECK(before.peak[MT_MEM_ACTIVATIONS] == 0);
    CHECK_OK(mt_op_gemm_ex(dev, false, true, batch, out, in, 1.0f, wb, wb, MT_BF16, 0.0f, y));
    CHECK_OK(mt_op_linear_forward_ex(dev, x, wb, MT_BF16, NULL, y, batch, in, out));
    CHECK_OK(mt_op_linear_backward_ex(dev, y, x, wb, MT_BF16, dx, dw, db, batch, in, out));
    mt_mem_stats after = stats(dev);
    /* The backward's scratch: the rounded output gradient and input, and the widened weight
     * (f32), or bf16 copies of the first two (oneDNN multiplies the bf16 weight as it is). */
    bool dnnl = on_onednn();
    size_t want_peak = dnnl ? (ni + no) * sizeof(uint16_t) : (ni + no + nw) * sizeof(float);
    CHECK_MSG(after.peak[MT_MEM_ACTIVATIONS] >= want_peak,
              "activations peaked at %zu bytes, less than the backward's scratch (%zu)",
              after.peak[MT_MEM_ACTIVATIONS], want_peak);
    CHECK_MSG(after.total_current == before.total_current,
              "%zu bytes still allocated after the ops (%zu before)", after.total_current,
              before.total_current);
    mt_device_close(dev);

    /* f32: room for the rounded input (ni floats) but not also the widened weight; oneDNN: for
     * half the rounded input's bf16 copy. */
    dev = NULL;
    size_t room = dnnl ? ni * sizeof(uint16_t) / 2 : ni * sizeof(float) + nw * sizeof(float) / 2;
    CHECK_OK(mt_device_open_cpu(room, &dev));
    if (dev) {
        mt_status st = mt_op_linear_forward_ex(dev, x, wb, MT_BF16, NULL, y, batch, in, out);
        CHECK_MSG(st == MT_ERR_OUT_OF_MEMORY, "%s: %s", mt_status_str(st), mt_last_error());
        CHECK(strstr(mt_last_error(), "linear_forward_ex") != NULL);
        st = mt_op_linear_backward_ex(dev, y, x, wb, MT_BF16, dx, dw, db, batch, in, out);
        CHECK_MSG(st == MT_ERR_OUT_OF_MEMORY, "%s: %s", mt_status_str(st), mt_last_error());
        after = stats(dev);
        CHECK_MSG(after.total_current == 0, "%zu bytes left allocated after failed ops",
                  after.total_current);
        mt_device_close(dev);
    }
    free(x), free(w), free(y), free(w_r), free(dx), free(dw), free(db), free(wb);
}

int main(void) {
    /* oneDNN 2.6's bf16 matmul needs AVX-512 (emulated without AVX512-BF16): forced onto a
     * smaller CPU it would fail every product. */
    if (on_onednn() && !mt_cpu_has(MT_CPU_AVX512F)) {
        printf("test_ops_bf16: skipped: MT_CPU_BF16_GEMM=onednn on a CPU without AVX-512\n");
        return 77;
    }
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return check_report("test_ops_bf16");
    test_gemm(dev);
    test_input_rounding(dev);
    test_linear(dev);
    test_errors(dev);
    test_primitives_kept(dev);
    mt_device_close(dev);
    test_scratch();
    return check_report("test_ops_bf16");
}
