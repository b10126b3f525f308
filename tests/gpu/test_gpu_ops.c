/* Every compute op (include/meshtrain/ops.h, core/ops_internal.h) on the GPU against the CPU
 * implementation, on random inputs of awkward sizes (not multiples of a warp or a block). Tolerances (f32): |gpu - cpu| /
 * max(|cpu|, 1) <= 1e-5 for elementwise ops, <= 1e-4 for reductions, GEMMs and what is built on
 * them (linear, LayerNorm, attention, cross-entropy, MSE). The bf16 GEMMs (gemm_ex, linear_*_ex)
 * get the f32 GEMMs' 1e-4: both devices multiply the same bf16 values (the rounding of f32 inputs
 * is the same rule on both), the products of two bf16 are exact in f32 and both accumulate in
 * f32, so only the summation order differs, as for f32. Casts and accumulations between f32 and
 * bf16 must be bit-exact. Exits 77 (ctest: skipped) without a GPU. */
#include "core/ops_internal.h"

#include "check.h"
#include "gpu_pair.h"
#include "numeric.h"

#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_ELEM 1e-5
#define TOL_RED 1e-4

static mt_device *cpu, *gpu;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double next_unit(void) { return test_rand_unit(&rng); }

static float *rand_floats(size_t n, float lo, float hi) {
    return test_rand_floats(&rng, n, lo, hi);
}

static int *rand_ints(size_t n, int lo, int hi) {
    int *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) abort();
    for (size_t i = 0; i < n; i++) p[i] = lo + (int)(next_unit() * (double)(hi - lo));
    return p;
}

/* A device copy of host data (NULL for NULL). */
static void *up(const void *host, size_t bytes) {
    if (!host) return NULL;
    void *d = NULL;
    CHECK_OK(mt_device_alloc(gpu, bytes, MT_MEM_OTHER, &d));
    if (d && bytes) CHECK_OK(mt_device_copy(gpu, d, host, bytes, MT_COPY_HOST_TO_DEVICE, NULL));
    return d;
}

static float *upf(const float *host, size_t n) { return up(host, n * sizeof(float)); }

/* Downloads n floats of d and compares them with the CPU's ref; frees d. */
static void compare(const char *what, float *d, const float *ref, size_t n, double tol) {
    float *back = malloc((n ? n : 1) * sizeof *back);
    if (!back) abort();
    CHECK_OK(mt_device_copy(gpu, back, d, n * sizeof *back, MT_COPY_DEVICE_TO_HOST, NULL));
    size_t at;
    double worst = test_max_rel_err(back, ref, n, &at);
    printf("  %-32s n %-8zu max rel err %.3g\n", what, n, worst);
    CHECK_MSG(worst <= tol, "%s: element %zu: gpu %.9g cpu %.9g (err %.3g > %.1g)", what, at,
              n ? (double)back[at] : 0.0, n ? (double)ref[at] : 0.0, worst, tol);
    free(back);
    mt_device_free(gpu, d);
}

/* Downloads `bytes` of d and compares them bit for bit with the CPU's ref, counting differing
 * elements of elem_size bytes; frees d. */
static void compare_bits(const char *what, void *d, const void *ref, size_t n, size_t elem_size) {
    size_t bytes = n * elem_size;
    unsigned char *back = malloc(bytes ? bytes : 1);
    if (!back) abort();
    CHECK_OK(mt_device_copy(gpu, back, d, bytes, MT_COPY_DEVICE_TO_HOST, NULL));
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(back + i * elem_size, (const unsigned char *)ref + i * elem_size, elem_size)) {
            if (!wrong) first = i;
            wrong++;
        }
    printf("  %-32s n %-8zu differing %zu\n", what, n, wrong);
    CHECK_MSG(wrong == 0, "%s: %zu of %zu elements differ from the CPU's bits, first %zu", what,
              wrong, n, first);
    free(back);
    mt_device_free(gpu, d);
}

/* The bf16 copy of n floats (rounded as mt_f32_to_bf16). */
static mt_bf16 *to_bf16(const float *src, size_t n) {
    mt_bf16 *b = malloc((n ? n : 1) * sizeof *b);
    if (!b) abort();
    for (size_t i = 0; i < n; i++) b[i] = mt_f32_to_bf16(src[i]);
    return b;
}

/* ---- MLP ops --------------------------------------------------------------------------------- */

static void test_gemm(void) {
    const int m = 37, n = 53, k = 29;
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            float *a = rand_floats((size_t)m * k, -1, 1), *b = rand_floats((size_t)k * n, -1, 1);
            float *c = rand_floats((size_t)m * n, -1, 1);
            float *da = upf(a, (size_t)m * k), *db = upf(b, (size_t)k * n);
            float *dc = upf(c, (size_t)m * n);
            CHECK_OK(mt_op_gemm(cpu, ta, tb, m, n, k, 0.7f, a, b, 0.5f, c));
            CHECK_OK(mt_op_gemm(gpu, ta, tb, m, n, k, 0.7f, da, db, 0.5f, dc));
            char what[64];
            snprintf(what, sizeof what, "gemm trans_a %d trans_b %d", ta, tb);
            compare(what, dc, c, (size_t)m * n, TOL_RED);
            mt_device_free(gpu, da);
            mt_device_free(gpu, db);
            free(a), free(b), free(c);
        }
    }
    /* k = 0: only beta applies; beta = 0 clears even NaN. */
    float *c = rand_floats(12, -1, 1);
    c[3] = NAN;
    float *dc = upf(c, 12);
    CHECK_OK(mt_op_gemm(cpu, false, false, 3, 4, 0, 1.0f, NULL, NULL, 0.0f, c));
    CHECK_OK(mt_op_gemm(gpu, false, false, 3, 4, 0, 1.0f, NULL, NULL, 0.0f, dc));
    compare("gemm k 0 beta 0", dc, c, 12, TOL_ELEM);
    free(c);
}

static void test_linear(void) {
    const int batch = 13, in = 31, out = 17;
    size_t ni = (size_t)batch * in, no = (size_t)batch * out, nw = (size_t)out * in;
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        float *x = rand_floats(ni, -1, 1), *w = rand_floats(nw, -1, 1);
        float *bias = with_bias ? rand_floats((size_t)out, -1, 1) : NULL;
        float *y = rand_floats(no, -1, 1), *dy = rand_floats(no, -1, 1);
        float *dx = rand_floats(ni, -1, 1), *dw = rand_floats(nw, -1, 1);
        float *db = rand_floats((size_t)out, -1, 1);
        float *gx = upf(x, ni), *gw = upf(w, nw), *gb = upf(bias, (size_t)out);
        float *gy = upf(y, no), *gdy = upf(dy, no), *gdx = upf(dx, ni), *gdw = upf(dw, nw);
        float *gdb = upf(db, (size_t)out);
        CHECK_OK(mt_op_linear_forward(cpu, x, w, bias, y, batch, in, out));
        CHECK_OK(mt_op_linear_forward(gpu, gx, gw, gb, gy, batch, in, out));
        compare(with_bias ? "linear_forward bias" : "linear_forward", gy, y, no, TOL_RED);
        /* Without a bias the input gradient is skipped too (d_in NULL). */
        CHECK_OK(mt_op_linear_backward(cpu, dy, x, w, with_bias ? dx : NULL, dw,
                                       with_bias ? db : NULL, batch, in, out));
        CHECK_OK(mt_op_linear_backward(gpu, gdy, gx, gw, with_bias ? gdx : NULL, gdw,
                                       with_bias ? gdb : NULL, batch, in, out));
        compare("linear_backward d_in", gdx, dx, ni, TOL_RED);
        compare("linear_backward d_w", gdw, dw, nw, TOL_RED);
        compare("linear_backward d_bias", gdb, db, (size_t)out, TOL_RED);
        mt_device_free(gpu, gx), mt_device_free(gpu, gw), mt_device_free(gpu, gb);
        mt_device_free(gpu, gdy);
        free(x), free(w), free(bias), free(y), free(dy), free(dx), free(dw), free(db);
    }
}

/* bf16 x bf16 products with f32 accumulation; k 515 spans several of cuBLAS's k-tiles. */
static void test_gemm_ex(void) {
    const int sizes[2][3] = {{37, 53, 29}, {19, 45, 515}};
    for (int s = 0; s < 2; s++) {
        int m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
        for (int ta = 0; ta < 2; ta++) {
            for (int tb = 0; tb < 2; tb++) {
                float *fa = rand_floats((size_t)m * k, -1, 1);
                float *fb = rand_floats((size_t)k * n, -1, 1);
                mt_bf16 *a = to_bf16(fa, (size_t)m * k), *b = to_bf16(fb, (size_t)k * n);
                float *c = rand_floats((size_t)m * n, -1, 1);
                void *da = up(a, (size_t)m * k * sizeof *a), *db = up(b, (size_t)k * n * sizeof *b);
                float *dc = upf(c, (size_t)m * n);
                CHECK_OK(mt_op_gemm_ex(cpu, ta, tb, m, n, k, 0.7f, a, b, MT_BF16, 0.5f, c));
                CHECK_OK(mt_op_gemm_ex(gpu, ta, tb, m, n, k, 0.7f, da, db, MT_BF16, 0.5f, dc));
                char what[64];
                snprintf(what, sizeof what, "gemm_ex bf16 k %d trans_a %d trans_b %d", k, ta, tb);
                compare(what, dc, c, (size_t)m * n, TOL_RED);
                mt_device_free(gpu, da);
                mt_device_free(gpu, db);
                free(fa), free(fb), free(a), free(b), free(c);
            }
        }
    }
    /* k = 0: only beta applies; beta = 0 clears even NaN. */
    float *c = rand_floats(12, -1, 1);
    c[3] = NAN;
    float *dc = upf(c, 12);
    CHECK_OK(mt_op_gemm_ex(cpu, false, false, 3, 4, 0, 1.0f, NULL, NULL, MT_BF16, 0.0f, c));
    CHECK_OK(mt_op_gemm_ex(gpu, false, false, 3, 4, 0, 1.0f, NULL, NULL, MT_BF16, 0.0f, dc));
    compare("gemm_ex bf16 k 0 beta 0", dc, c, 12, TOL_ELEM);
    free(c);
}

/* Linear layers with a bf16 weight: f32 input and output gradient rounded to bf16 on both
 * devices by the same rule, f32 outputs and gradients. */
static void test_linear_ex(void) {
    const int batch = 13, in = 31, out = 17;
    size_t ni = (size_t)batch * in, no = (size_t)batch * out, nw = (size_t)out * in;
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        float *x = rand_floats(ni, -1, 1), *fw = rand_floats(nw, -1, 1);
        mt_bf16 *w = to_bf16(fw, nw);
        float *bias = with_bias ? rand_floats((size_t)out, -1, 1) : NULL;
        float *y = rand_floats(no, -1, 1), *dy = rand_floats(no, -1, 1);
        float *dx = rand_floats(ni, -1, 1), *dw = rand_floats(nw, -1, 1);
        float *db = rand_floats((size_t)out, -1, 1);
        float *gx = upf(x, ni), *gb = upf(bias, (size_t)out);
        void *gw = up(w, nw * sizeof *w);
        float *gy = upf(y, no), *gdy = upf(dy, no), *gdx = upf(dx, ni), *gdw = upf(dw, nw);
        float *gdb = upf(db, (size_t)out);
        CHECK_OK(mt_op_linear_forward_ex(cpu, x, w, MT_BF16, bias, y, batch, in, out));
        CHECK_OK(mt_op_linear_forward_ex(gpu, gx, gw, MT_BF16, gb, gy, batch, in, out));
        compare(with_bias ? "linear_forward_ex bf16 bias" : "linear_forward_ex bf16", gy, y, no,
                TOL_RED);
        /* Without a bias the input gradient is skipped too (d_in NULL). */
        CHECK_OK(mt_op_linear_backward_ex(cpu, dy, x, w, MT_BF16, with_bias ? dx : NULL, dw,
                                          with_bias ? db : NULL, batch, in, out));
        CHECK_OK(mt_op_linear_backward_ex(gpu, gdy, gx, gw, MT_BF16, with_bias ? gdx : NULL, gdw,
                                          with_bias ? gdb : NULL, batch, in, out));
        compare("linear_backward_ex bf16 d_in", gdx, dx, ni, TOL_RED);
        compare("linear_backward_ex bf16 d_w", gdw, dw, nw, TOL_RED);
        compare("linear_backward_ex bf16 d_bias", gdb, db, (size_t)out, TOL_RED);
        mt_device_free(gpu, gx), mt_device_free(gpu, gw), mt_device_free(gpu, gb);
        mt_device_free(gpu, gdy);
        free(x), free(fw), free(w), free(bias), free(y), free(dy), free(dx), free(dw), free(db);
    }
}

/* mt_op_cast and mt_op_accumulate between f32 and bf16: the GPU's bits must be the CPU's. */
static void test_cast(void) {
    /* Every bf16 pattern widened (NaNs included), and back. */
    enum { NB = 65536 };
    mt_bf16 *bits = malloc(NB * sizeof *bits);
    float *wide = malloc(NB * sizeof *wide);
    if (!bits || !wide) abort();
    for (size_t i = 0; i < NB; i++) bits[i] = (mt_bf16)i;
    void *gbits = up(bits, NB * sizeof *bits);
    float *gwide = upf(wide, NB);
    CHECK_OK(mt_op_cast(cpu, bits, MT_BF16, wide, MT_F32, NB));
    CHECK_OK(mt_op_cast(gpu, gbits, MT_BF16, gwide, MT_F32, NB));
    mt_device_free(gpu, gbits);
    compare_bits("cast bf16 -> f32 (all patterns)", gwide, wide, NB, sizeof(float));
    /* f32 -> bf16 on random values, ties (x + half a bf16 step, odd and even kept parts), NaN
     * payloads only in the dropped half, infinities, the largest finite values, denormals. */
    const size_t n = 70001;
    float *f = rand_floats(n, -4, 4);
    uint32_t special[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f800001u, 0xff800001u,
                          0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0xff7fffffu,
                          0x00000001u, 0x007fffffu, 0x80008000u, 0x00018000u, 0x00000000u,
                          0x80000000u};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        memcpy(&f[i], &special[i], sizeof f[i]);
    for (size_t i = 100; i < 20100; i++) { /* exact ties everywhere in the range */
        uint32_t u = (uint32_t)(next_unit() * 4294967296.0);
        u = (u & 0xffff0000u) | 0x8000u;
        memcpy(&f[i], &u, sizeof u);
    }
    mt_bf16 *half = malloc(n * sizeof *half);
    if (!half) abort();
    float *gf = upf(f, n);
    void *ghalf = up(half, n * sizeof *half);
    CHECK_OK(mt_op_cast(cpu, f, MT_F32, half, MT_BF16, n));
    CHECK_OK(mt_op_cast(gpu, gf, MT_F32, ghalf, MT_BF16, n));
    int wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += half[i] != mt_f32_to_bf16(f[i]);
    CHECK_MSG(wrong == 0, "%d CPU casts differ from mt_f32_to_bf16", wrong);
    compare_bits("cast f32 -> bf16", ghalf, half, n, sizeof *half);
    /* Same dtype: a copy. */
    float *copy = rand_floats(n, -1, 1), *gcopy = upf(copy, n);
    CHECK_OK(mt_op_cast(cpu, f, MT_F32, copy, MT_F32, n));
    CHECK_OK(mt_op_cast(gpu, gf, MT_F32, gcopy, MT_F32, n));
    compare_bits("cast f32 -> f32", gcopy, copy, n, sizeof(float));
    /* Accumulate from f32, then from bf16, on finite values (a sum with a NaN operand may carry
     * another NaN payload on the GPU, which says nothing about the op), denormals included. */
    float *src = rand_floats(n, -4, 4), *acc = rand_floats(n, -2, 2);
    for (size_t i = 0; i < 64; i++) src[i] = (float)(i + 1) * 1e-39f;
    mt_bf16 *src_half = to_bf16(src, n);
    float *gsrc = upf(src, n), *gacc = upf(acc, n);
    void *gsrc_half = up(src_half, n * sizeof *src_half);
    CHECK_OK(mt_op_accumulate(cpu, acc, src, MT_F32, n));
    CHECK_OK(mt_op_accumulate(gpu, gacc, gsrc, MT_F32, n));
    CHECK_OK(mt_op_accumulate(cpu, acc, src_half, MT_BF16, n));
    CHECK_OK(mt_op_accumulate(gpu, gacc, gsrc_half, MT_BF16, n));
    compare_bits("accumulate f32 then bf16", gacc, acc, n, sizeof(float));
    mt_device_free(gpu, gf), mt_device_free(gpu, gsrc), mt_device_free(gpu, gsrc_half);
    free(bits), free(wide), free(f), free(half), free(copy), free(src), free(acc), free(src_half);
}

static void test_relu_mse_adamw(void) {
    const size_t n = 1001;
    float *x = rand_floats(n, -1, 1), *y = rand_floats(n, -1, 1), *dy = rand_floats(n, -1, 1);
    float *dx = rand_floats(n, -1, 1);
    float *gx = upf(x, n), *gy = upf(y, n), *gdy = upf(dy, n), *gdx = upf(dx, n);
    CHECK_OK(mt_op_relu_forward(cpu, x, y, n));
    CHECK_OK(mt_op_relu_forward(gpu, gx, gy, n));
    CHECK_OK(mt_op_relu_backward(cpu, y, dy, dx, n));
    CHECK_OK(mt_op_relu_backward(gpu, gy, gdy, gdx, n));
    compare("relu_forward", gy, y, n, TOL_ELEM);
    compare("relu_backward", gdx, dx, n, TOL_ELEM);

    float *t = rand_floats(n, -1, 1), *dp = rand_floats(n, -1, 1);
    float *gt = upf(t, n), *gdp = upf(dp, n);
    float loss_cpu = 0.0f, loss_gpu = -1.0f;
    CHECK_OK(mt_op_mse_forward(cpu, x, t, n, &loss_cpu));
    CHECK_OK(mt_op_mse_forward(gpu, gx, gt, n, &loss_gpu)); /* a host float for the loss */
    printf("  %-32s cpu %.9g gpu %.9g\n", "mse_forward", (double)loss_cpu, (double)loss_gpu);
    CHECK(fabs((double)loss_gpu - (double)loss_cpu) <= TOL_RED * fmax(fabs(loss_cpu), 1.0));
    CHECK_OK(mt_op_mse_backward(cpu, x, t, n, 0.25f, dp));
    CHECK_OK(mt_op_mse_backward(gpu, gx, gt, n, 0.25f, gdp));
    compare("mse_backward", gdp, dp, n, TOL_ELEM);

    float *p = rand_floats(n, -1, 1), *g = rand_floats(n, -1, 1), *m = rand_floats(n, -0.1f, 0.1f);
    float *v = rand_floats(n, 0, 0.01f);
    float *gp = upf(p, n), *gg = upf(g, n), *gm = upf(m, n), *gv = upf(v, n);
    for (long step = 1; step <= 3; step++) {
        CHECK_OK(mt_op_adamw(cpu, p, g, m, v, n, step, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f));
        CHECK_OK(mt_op_adamw(gpu, gp, gg, gm, gv, n, step, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f));
    }
    compare("adamw param", gp, p, n, TOL_ELEM);
    compare("adamw m", gm, m, n, TOL_ELEM);
    compare("adamw v", gv, v, n, TOL_ELEM);
    mt_device_free(gpu, gx), mt_device_free(gpu, gdy), mt_device_free(gpu, gt);
    mt_device_free(gpu, gg);
    free(x), free(y), free(dy), free(dx), free(t), free(dp), free(p), free(g), free(m), free(v);
}

/* ---- GPT ops --------------------------------------------------------------------------------- */

static void test_embeddings(void) {
    const size_t n = 50;
    const int C = 37, start = 10, local = 20, B = 3, T = 7;
    int *ids = rand_ints(n, 0, 40); /* some inside [10, 30), some outside; repeats */
    int *gids = up(ids, n * sizeof *ids);
    float *wte = rand_floats((size_t)local * C, -1, 1), *gwte = upf(wte, (size_t)local * C);
    for (int acc = 0; acc < 2; acc++) {
        float *out = rand_floats(n * C, -1, 1), *gout = upf(out, n * C);
        CHECK_OK(mt_op_embedding_forward(cpu, ids, n, wte, start, local, C, out, acc));
        CHECK_OK(mt_op_embedding_forward(gpu, gids, n, gwte, start, local, C, gout, acc));
        compare(acc ? "embedding_forward accumulate" : "embedding_forward", gout, out, n * C,
                TOL_ELEM);
        free(out);
    }
    float *dout = rand_floats(n * C, -1, 1), *dwte = rand_floats((size_t)local * C, -1, 1);
    float *gdout = upf(dout, n * C), *gdwte = upf(dwte, (size_t)local * C);
    CHECK_OK(mt_op_embedding_backward(cpu, ids, n, dout, start, local, C, dwte));
    CHECK_OK(mt_op_embedding_backward(gpu, gids, n, gdout, start, local, C, gdwte));
    compare("embedding_backward", gdwte, dwte, (size_t)local * C, TOL_RED);

    size_t per = (size_t)T * C, all = (size_t)B * per;
    float *wpe = rand_floats(per, -1, 1), *x = rand_floats(all, -1, 1);
    float *gwpe = upf(wpe, per), *gx = upf(x, all);
    CHECK_OK(mt_op_position_forward(cpu, wpe, B, T, C, x));
    CHECK_OK(mt_op_position_forward(gpu, gwpe, B, T, C, gx));
    compare("position_forward", gx, x, all, TOL_ELEM);
    float *dx = rand_floats(all, -1, 1), *dwpe = rand_floats(per, -1, 1);
    float *gdx = upf(dx, all), *gdwpe = upf(dwpe, per);
    CHECK_OK(mt_op_position_backward(cpu, dx, B, T, C, dwpe));
    CHECK_OK(mt_op_position_backward(gpu, gdx, B, T, C, gdwpe));
    compare("position_backward", gdwpe, dwpe, per, TOL_RED);
    mt_device_free(gpu, gids), mt_device_free(gpu, gwte), mt_device_free(gpu, gdout);
    mt_device_free(gpu, gwpe), mt_device_free(gpu, gdx);
    free(ids), free(wte), free(dout), free(dwte), free(wpe), free(x), free(dx), free(dwpe);
}

static void test_layernorm(int C) {
    const size_t n = 19;
    size_t nc = n * (size_t)C;
    float *x = rand_floats(nc, -2, 3), *gam = rand_floats((size_t)C, 0.5f, 1.5f);
    float *bet = rand_floats((size_t)C, -0.5f, 0.5f), *y = rand_floats(nc, -1, 1);
    float *mean = rand_floats(n, 0, 1), *rstd = rand_floats(n, 0, 1);
    float *gx = upf(x, nc), *ggam = upf(gam, (size_t)C), *gbet = upf(bet, (size_t)C);
    float *gy = upf(y, nc), *gmean = upf(mean, n), *grstd = upf(rstd, n);
    CHECK_OK(mt_op_layernorm_forward(cpu, x, gam, bet, n, C, y, mean, rstd));
    CHECK_OK(mt_op_layernorm_forward(gpu, gx, ggam, gbet, n, C, gy, gmean, grstd));
    char what[64];
    snprintf(what, sizeof what, "layernorm_forward C %d", C);
    compare(what, gy, y, nc, TOL_RED);
    float *dy = rand_floats(nc, -1, 1), *dx = rand_floats(nc, -1, 1);
    float *dg = rand_floats((size_t)C, -1, 1), *db = rand_floats((size_t)C, -1, 1);
    float *gdy = upf(dy, nc), *gdx = upf(dx, nc), *gdg = upf(dg, (size_t)C);
    float *gdb = upf(db, (size_t)C);
    /* Backward from the GPU's own saved statistics, which were compared just below. */
    CHECK_OK(mt_op_layernorm_backward(cpu, dy, x, gam, mean, rstd, n, C, dx, dg, db));
    CHECK_OK(mt_op_layernorm_backward(gpu, gdy, gx, ggam, gmean, grstd, n, C, gdx, gdg, gdb));
    compare("layernorm_backward d_in", gdx, dx, nc, TOL_RED);
    compare("layernorm_backward d_gamma", gdg, dg, (size_t)C, TOL_RED);
    compare("layernorm_backward d_beta", gdb, db, (size_t)C, TOL_RED);
    compare("layernorm_forward mean", gmean, mean, n, TOL_RED);
    compare("layernorm_forward rstd", grstd, rstd, n, TOL_RED);
    mt_device_free(gpu, gx), mt_device_free(gpu, ggam), mt_device_free(gpu, gbet);
    mt_device_free(gpu, gdy);
    free(x), free(gam), free(bet), free(y), free(mean), free(rstd), free(dy), free(dx), free(dg);
    free(db);
}

static void test_gelu_add(void) {
    const size_t n = 1003;
    float *x = rand_floats(n, -5, 5), *y = rand_floats(n, -1, 1), *dy = rand_floats(n, -1, 1);
    float *dx = rand_floats(n, -1, 1);
    float *gx = upf(x, n), *gy = upf(y, n), *gdy = upf(dy, n), *gdx = upf(dx, n);
    CHECK_OK(mt_op_gelu_forward(cpu, x, y, n));
    CHECK_OK(mt_op_gelu_forward(gpu, gx, gy, n));
    CHECK_OK(mt_op_gelu_backward(cpu, x, dy, dx, n));
    CHECK_OK(mt_op_gelu_backward(gpu, gx, gdy, gdx, n));
    compare("gelu_forward", gy, y, n, TOL_ELEM);
    compare("gelu_backward", gdx, dx, n, TOL_ELEM);
    /* add with the output aliasing the first input, as the residual stream does */
    float *a = rand_floats(n, -1, 1), *b = rand_floats(n, -1, 1);
    float *ga = upf(a, n), *gb = upf(b, n);
    CHECK_OK(mt_op_add(cpu, a, b, a, n));
    CHECK_OK(mt_op_add(gpu, ga, gb, ga, n));
    compare("add (aliased)", ga, a, n, TOL_ELEM);
    mt_device_free(gpu, gx), mt_device_free(gpu, gdy), mt_device_free(gpu, gb);
    free(x), free(y), free(dy), free(dx), free(a), free(b);
}

/* The activations a model author composes, and the product, with saturating inputs mixed in. */
static void test_activations(size_t n) {
    typedef mt_status (*fwd_fn)(mt_device *, const float *, float *, size_t);
    typedef mt_status (*bwd_fn)(mt_device *, const float *, const float *, float *, size_t);
    static const struct {
        const char *name;
        fwd_fn forward;
        bwd_fn backward;
        bool backward_from_output;
    } ops[] = {{"tanh", mt_op_tanh_forward, mt_op_tanh_backward, true},
               {"sigmoid", mt_op_sigmoid_forward, mt_op_sigmoid_backward, true},
               {"silu", mt_op_silu_forward, mt_op_silu_backward, false}};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        float *x = rand_floats(n, -8, 8), *y = rand_floats(n, -1, 1), *dy = rand_floats(n, -1, 1);
        float *dx = rand_floats(n, -1, 1);
        if (n > 4) x[0] = 100.0f, x[1] = -100.0f, x[2] = 20.0f, x[3] = -20.0f;
        float *gx = upf(x, n), *gy = upf(y, n), *gdy = upf(dy, n), *gdx = upf(dx, n);
        CHECK_OK(ops[k].forward(cpu, x, y, n));
        CHECK_OK(ops[k].forward(gpu, gx, gy, n));
        CHECK_OK(ops[k].backward(cpu, ops[k].backward_from_output ? y : x, dy, dx, n));
        CHECK_OK(ops[k].backward(gpu, ops[k].backward_from_output ? gy : gx, gdy, gdx, n));
        char what[64];
        snprintf(what, sizeof what, "%s_forward", ops[k].name);
        compare(what, gy, y, n, TOL_ELEM);
        snprintf(what, sizeof what, "%s_backward", ops[k].name);
        compare(what, gdx, dx, n, TOL_ELEM);
        mt_device_free(gpu, gx), mt_device_free(gpu, gdy);
        free(x), free(y), free(dy), free(dx);
    }

    float *a = rand_floats(n, -2, 2), *b = rand_floats(n, -2, 2), *dy = rand_floats(n, -1, 1);
    float *da = rand_floats(n, -1, 1), *db = rand_floats(n, -1, 1), *dsq = rand_floats(n, -1, 1);
    float *ga = upf(a, n), *gb = upf(b, n), *gdy = upf(dy, n), *gda = upf(da, n);
    float *gdb = upf(db, n), *gdsq = upf(dsq, n);
    CHECK_OK(mt_op_mul_backward(cpu, a, b, dy, da, NULL, n)); /* d_b not wanted */
    CHECK_OK(mt_op_mul_backward(gpu, NULL, gb, gdy, gda, NULL, n));
    CHECK_OK(mt_op_mul_backward(cpu, a, b, dy, NULL, db, n));
    CHECK_OK(mt_op_mul_backward(gpu, ga, NULL, gdy, NULL, gdb, n));
    CHECK_OK(mt_op_mul_backward(cpu, a, a, dy, dsq, dsq, n)); /* a * a: one shared gradient */
    CHECK_OK(mt_op_mul_backward(gpu, ga, ga, gdy, gdsq, gdsq, n));
    compare("mul_backward d_a", gda, da, n, TOL_ELEM);
    compare("mul_backward d_b", gdb, db, n, TOL_ELEM);
    compare("mul_backward a*a", gdsq, dsq, n, TOL_ELEM);
    CHECK_OK(mt_op_mul(cpu, a, b, a, n)); /* output aliasing the first input */
    CHECK_OK(mt_op_mul(gpu, ga, gb, ga, n));
    compare("mul (aliased)", ga, a, n, TOL_ELEM);
    mt_device_free(gpu, gb), mt_device_free(gpu, gdy);
    free(a), free(b), free(dy), free(da), free(db), free(dsq);

    /* Which stream a user's kernel goes on: the legacy default one (NULL) on a GPU as well. */
    void *stream = &rng;
    CHECK_OK(mt_device_compute_stream(gpu, &stream));
    CHECK(stream == NULL);
}

static void test_attention(int B, int T, int H, int hd) {
    size_t W = (size_t)H * hd, rows = (size_t)B * T, nqkv = rows * 3 * W;
    size_t natt = (size_t)B * H * T * T;
    float *qkv = rand_floats(nqkv, -1, 1), *out = rand_floats(rows * W, -1, 1);
    float *att = rand_floats(natt, -1, 1);
    float *gqkv = upf(qkv, nqkv), *gout = upf(out, rows * W), *gatt = upf(att, natt);
    CHECK_OK(mt_op_attention_forward(cpu, qkv, B, T, H, hd, out, att));
    CHECK_OK(mt_op_attention_forward(gpu, gqkv, B, T, H, hd, gout, gatt));
    float *dy = rand_floats(rows * W, -1, 1), *dqkv = rand_floats(nqkv, -1, 1);
    float *gdy = upf(dy, rows * W), *gdqkv = upf(dqkv, nqkv);
    CHECK_OK(mt_op_attention_backward(cpu, dy, qkv, att, B, T, H, hd, dqkv));
    CHECK_OK(mt_op_attention_backward(gpu, gdy, gqkv, gatt, B, T, H, hd, gdqkv));
    char what[64];
    snprintf(what, sizeof what, "attention B%d T%d H%d hd%d out", B, T, H, hd);
    compare(what, gout, out, rows * W, TOL_RED);
    compare("attention att", gatt, att, natt, TOL_RED);
    compare("attention_backward d_qkv", gdqkv, dqkv, nqkv, TOL_RED);
    mt_device_free(gpu, gqkv), mt_device_free(gpu, gdy);
    free(qkv), free(out), free(att), free(dy), free(dqkv);
}

static void test_xent(void) {
    const size_t n = 23;
    const int start = 500, local = 1000;
    size_t nv = n * (size_t)local;
    float *logits = rand_floats(nv, -4, 4);
    int *targets = rand_ints(n, 0, 3000); /* about a third inside the slice */
    targets[0] = start, targets[1] = start + local - 1, targets[2] = start - 1;
    float *gl = upf(logits, nv);
    int *gt = up(targets, n * sizeof *targets);
    float *mx = malloc(n * sizeof *mx), *se = malloc(n * sizeof *se);
    float *tl = malloc(n * sizeof *tl), *loss = malloc(n * sizeof *loss);
    float *d = rand_floats(nv, -1, 1);
    if (!mx || !se || !tl || !loss) abort();
    float *gmx = upf(mx, n), *gse = upf(se, n), *gtl = upf(tl, n), *gloss = upf(loss, n);
    float *gd = upf(d, nv);
    CHECK_OK(mt_op_xent_local_max(cpu, logits, n, local, mx));
    CHECK_OK(mt_op_xent_local_max(gpu, gl, n, local, gmx));
    CHECK_OK(mt_op_xent_local_sums(cpu, logits, targets, n, start, local, mx, se, tl));
    CHECK_OK(mt_op_xent_local_sums(gpu, gl, gt, n, start, local, gmx, gse, gtl));
    CHECK_OK(mt_op_xent_loss_backward(cpu, logits, targets, n, start, local, mx, se, tl, 0.125f,
                                      loss, d));
    CHECK_OK(mt_op_xent_loss_backward(gpu, gl, gt, n, start, local, gmx, gse, gtl, 0.125f, gloss,
                                      gd));
    compare("xent_loss_backward d_logits", gd, d, nv, TOL_RED);
    /* The loss only (an evaluation pass: d_logits NULL). */
    CHECK_OK(mt_op_xent_loss_backward(gpu, gl, gt, n, start, local, gmx, gse, gtl, 0.125f, gloss,
                                      NULL));
    compare("xent_loss_backward loss", gloss, loss, n, TOL_RED);
    compare("xent_local_sums sum_exp", gse, se, n, TOL_RED);
    compare("xent_local_sums target", gtl, tl, n, TOL_ELEM);

    /* A non-finite maximum in row 5 is refused on both devices, naming the row. */
    mx[5] = INFINITY;
    float *gbad = upf(mx, n), *gse2 = upf(se, n), *gtl2 = upf(tl, n);
    mt_status s_cpu = mt_op_xent_local_sums(cpu, logits, targets, n, start, local, mx, se, tl);
    mt_status s_gpu = mt_op_xent_local_sums(gpu, gl, gt, n, start, local, gbad, gse2, gtl2);
    CHECK(s_cpu == MT_ERR_INVALID_ARG);
    CHECK_MSG(s_gpu == MT_ERR_INVALID_ARG && strstr(mt_last_error(), "row 5 "), "%s: %s",
              mt_status_str(s_gpu), mt_last_error());
    compare("xent_local_max", gmx, mx, 5, TOL_ELEM); /* rows before the one set to inf */
    mt_device_free(gpu, gbad), mt_device_free(gpu, gse2), mt_device_free(gpu, gtl2);
    mt_device_free(gpu, gl), mt_device_free(gpu, gt);
    free(logits), free(targets), free(mx), free(se), free(tl), free(loss), free(d);
}

int main(void) {
    /* MT_TEST_OPS_SELF=1 runs the whole program with a second CPU device in the GPU's place: a
     * check of this program's own bookkeeping (under ASan) on a machine without a GPU. */
    bool self_check;
    int rc = gpu_pair_open("test_gpu_ops", &cpu, &gpu, &self_check);
    if (rc >= 0) return rc;
    test_gemm();
    test_linear();
    test_gemm_ex();
    test_linear_ex();
    test_cast();
    test_relu_mse_adamw();
    test_embeddings();
    test_layernorm(67);
    test_layernorm(1000);
    test_gelu_add();
    test_activations(1);
    test_activations(1003);
    test_attention(2, 9, 3, 8);
    test_attention(2, 300, 2, 16); /* rows longer than a block of threads */
    test_xent();
    CHECK_OK(mt_device_synchronize(gpu));
    mt_device_close(gpu);
    mt_device_close(cpu);
    return check_report("test_gpu_ops");
}
