/* The backward ops' overwrite forms (ops.h, MT_OVERWRITE_*): mt_op_linear_backward_into (f32
 * and bf16 weights, a product small enough for one sgemm call and one the CPU device splits into
 * blocks; thin products of one row or column; an empty batch), mt_op_layernorm_backward_into,
 * mt_op_position_backward_into (also over no rows), mt_op_gelu_backward_into and
 * mt_op_attention_backward_into (sequences longer than one of its product blocks), for every combination
 * of flags: each flagged output, prefilled with NaN, must come out with the bits of the plain op
 * adding into zeros; each unflagged one, prefilled with random values, with the bits of the plain
 * op adding into the same values. One column of the output gradient is -0 throughout, so that
 * the sums it enters are zeros whose sign the claim covers (0 + -0 is +0); for the linear, one
 * row too, and the input's and the weight's column 0 positive, so that some sums of d_w and
 * d_in hold nothing but -0 products. bf16 runs on the product path of this CPU
 * (MT_CPU_BF16_GEMM; ops_dispatch.cmake runs both), with no rows as well. Flags an op has no output
 * for are refused. */
#include "check.h"
#include "numeric.h"

#include "core/cpu/bf16_gemm_path.h"
#include "core/cpu/cpu_features.h"

#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x0e77e17eULL;

static float *rnd_vec(size_t n) { return test_lcg_floats(&rng_state, n, 1.0); }

static float *nan_vec(size_t n) {
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; v && i < n; i++) v[i] = NAN;
    return v;
}

static float *copy_vec(const float *src, size_t n) {
    float *v = malloc(n * sizeof *v);
    if (v) memcpy(v, src, n * sizeof *v);
    return v;
}

/* Column col of rows x cols set to -0. */
static void negative_zero_column(float *m, size_t rows, size_t cols, size_t col) {
    for (size_t r = 0; r < rows; r++) m[r * cols + col] = -0.0f;
}

/* Column col of rows x cols made positive: against a -0 row or column of the output gradient,
 * every product of a sum is then -0, which only a sum that starts from +0 turns into +0 (a
 * kernel that starts from its first product, written with beta 0, would keep -0). */
static void positive_column(float *m, size_t rows, size_t cols, size_t col) {
    for (size_t r = 0; r < rows; r++) m[r * cols + col] = fabsf(m[r * cols + col]) + 0.25f;
}

/* One output of an op under test: its size, its reference (the plain op's result from `base`),
 * what the overwrite form got, and whether it was flagged. */
typedef struct out_buf {
    size_t n;
    float *base, *want, *got;
} out_buf;

/* Prepares o for a run: base random, want = base (the plain op adds into it, or zeros when
 * flagged), got = NaN when flagged, else base. */
static void out_prepare(out_buf *o, size_t n, bool flagged) {
    o->n = n;
    o->base = rnd_vec(n);
    o->want = flagged ? calloc(n, sizeof(float)) : copy_vec(o->base, n);
    o->got = flagged ? nan_vec(n) : copy_vec(o->base, n);
}

static void out_check(const char *what, const out_buf *o, unsigned flags) {
    size_t bad = 0;
    for (size_t i = 0; o->got && o->want && i < o->n; i++)
        bad += memcmp(&o->got[i], &o->want[i], sizeof(float)) != 0;
    CHECK_MSG(o->got && o->want && bad == 0, "%s (flags 0x%x): %zu of %zu elements differ from "
              "the plain op's", what, flags, bad, o->n);
}

static void out_free(out_buf *o) {
    free(o->base);
    free(o->want);
    free(o->got);
}

/* Linear backward, batch x in -> out, weight f32 or bf16, every flag combination. */
static void test_linear(mt_device *dev, int batch, int in, int out, mt_dtype wt) {
    size_t nb = (size_t)batch, ni = (size_t)in, no = (size_t)out;
    float *d_out = rnd_vec(nb * no), *x = rnd_vec(nb * ni), *w32 = rnd_vec(no * ni);
    /* d_w's row no / 2 against x's column 0, and (with two rows or more) d_in's row 1 against
     * w's column 0: sums of -0 products only. */
    if (nb) {
        negative_zero_column(d_out, nb, no, no / 2);
        positive_column(x, nb, ni, 0);
    }
    if (nb > 1) {
        for (size_t c = 0; c < no; c++) d_out[1 * no + c] = -0.0f;
        positive_column(w32, no, ni, 0);
    }
    mt_bf16 *w16 = malloc(no * ni * sizeof *w16);
    if (w16) mt_f32_to_bf16_array(w32, w16, no * ni);
    const void *w = wt == MT_BF16 ? (const void *)w16 : (const void *)w32;
    for (unsigned flags = 0; flags < 8; flags++) {
        out_buf din, dw, db;
        out_prepare(&din, nb * ni, flags & MT_OVERWRITE_D_IN);
        out_prepare(&dw, no * ni, flags & MT_OVERWRITE_D_W);
        out_prepare(&db, no, flags & MT_OVERWRITE_D_BIAS);
        CHECK_OK(mt_op_linear_backward_ex(dev, d_out, x, w, wt, din.want, dw.want, db.want, batch,
                                          in, out));
        CHECK_OK(mt_op_linear_backward_into(dev, d_out, x, w, wt, din.got, dw.got, db.got, batch,
                                            in, out, flags));
        char what[96];
        snprintf(what, sizeof what, "linear %dx%d->%d %s", batch, in, out, mt_dtype_name(wt));
        out_check(what, &din, flags);
        out_check(what, &dw, flags);
        out_check(what, &db, flags);
        out_free(&din);
        out_free(&dw);
        out_free(&db);
    }
    free(d_out);
    free(x);
    free(w32);
    free(w16);
}

/* LayerNorm backward over N rows (0: no rows, the flagged parameter gradients are zeros). */
static void test_layernorm(mt_device *dev, size_t N) {
    enum { C = 48 };
    float *x = rnd_vec(N * C), *gamma = rnd_vec(C), *beta = rnd_vec(C), *d_out = rnd_vec(N * C);
    if (N) negative_zero_column(d_out, N, C, 5);
    float *y = malloc((N ? N : 1) * C * sizeof *y), *mean = malloc((N ? N : 1) * sizeof *mean),
          *rstd = malloc((N ? N : 1) * sizeof *rstd);
    CHECK_OK(mt_op_layernorm_forward(dev, x, gamma, beta, N, C, y, mean, rstd));
    for (unsigned flags = 0; flags < 8; flags++) {
        out_buf din, dg, db;
        out_prepare(&din, N * C, flags & MT_OVERWRITE_D_IN);
        out_prepare(&dg, C, flags & MT_OVERWRITE_D_W);
        out_prepare(&db, C, flags & MT_OVERWRITE_D_BIAS);
        CHECK_OK(mt_op_layernorm_backward(dev, d_out, x, gamma, mean, rstd, N, C, din.want,
                                          dg.want, db.want));
        CHECK_OK(mt_op_layernorm_backward_into(dev, d_out, x, gamma, mean, rstd, N, C, din.got,
                                               dg.got, db.got, flags));
        out_check("layernorm d_in", &din, flags);
        out_check("layernorm d_gamma", &dg, flags);
        out_check("layernorm d_beta", &db, flags);
        out_free(&din);
        out_free(&dg);
        out_free(&db);
    }
    free(x);
    free(gamma);
    free(beta);
    free(d_out);
    free(y);
    free(mean);
    free(rstd);
}

/* Position backward over a batch of B (0: none, a flagged d_wpe is zeros). */
static void test_position(mt_device *dev, int B) {
    enum { T = 7, C = 20 };
    float *d_out = rnd_vec((size_t)B * T * C);
    if (B) negative_zero_column(d_out, (size_t)B * T, C, 3);
    for (unsigned flags = 0; flags <= MT_OVERWRITE_D_W; flags += MT_OVERWRITE_D_W) {
        out_buf dw;
        out_prepare(&dw, T * C, flags != 0);
        CHECK_OK(mt_op_position_backward(dev, d_out, B, T, C, dw.want));
        CHECK_OK(mt_op_position_backward_into(dev, d_out, B, T, C, dw.got, flags));
        out_check("position d_wpe", &dw, flags);
        out_free(&dw);
    }
    float wpe[T * C];
    mt_status st = mt_op_position_backward_into(dev, d_out, B, T, C, wpe, MT_OVERWRITE_D_BIAS);
    CHECK_MSG(st == MT_ERR_INVALID_ARG, "position backward took MT_OVERWRITE_D_BIAS (status %d)",
              (int)st);
    free(d_out);
}

/* GELU backward over n elements, some of the output gradient -0 (0 + -0 is +0). */
static void test_gelu(mt_device *dev, size_t n) {
    float *x = rnd_vec(n), *d_out = rnd_vec(n);
    for (size_t i = 0; i < n; i += 7) d_out[i] = -0.0f;
    for (unsigned flags = 0; flags <= MT_OVERWRITE_D_IN; flags += MT_OVERWRITE_D_IN) {
        out_buf din;
        out_prepare(&din, n, flags != 0);
        CHECK_OK(mt_op_gelu_backward(dev, x, d_out, din.want, n));
        CHECK_OK(mt_op_gelu_backward_into(dev, x, d_out, din.got, n, flags));
        out_check("gelu d_in", &din, flags);
        out_free(&din);
    }
    float one = 0.0f;
    mt_status st = mt_op_gelu_backward_into(dev, x, d_out, &one, n ? 1 : 0, MT_OVERWRITE_D_W);
    CHECK_MSG(st == MT_ERR_INVALID_ARG, "gelu backward took MT_OVERWRITE_D_W (status %d)",
              (int)st);
    free(x);
    free(d_out);
}

/* Attention backward: B sequences of T positions (T over the CPU's 64-row product blocks), NH
 * heads of HD; one head's output gradient column -0 throughout. */
static void test_attention(mt_device *dev, int B, int T) {
    enum { NH = 3, HD = 8, W = NH * HD };
    size_t rows = (size_t)B * T, nqkv = rows * 3 * W, natt = (size_t)B * NH * T * T;
    float *qkv = rnd_vec(nqkv), *d_out = rnd_vec(rows * W);
    float *y = malloc((rows ? rows : 1) * W * sizeof *y), *att = malloc((natt ? natt : 1) *
                                                                          sizeof *att);
    if (rows) negative_zero_column(d_out, rows, W, HD + 2);
    CHECK_OK(mt_op_attention_forward(dev, qkv, B, T, NH, HD, y, att));
    for (unsigned flags = 0; flags <= MT_OVERWRITE_D_IN; flags += MT_OVERWRITE_D_IN) {
        out_buf dqkv;
        out_prepare(&dqkv, nqkv, flags != 0);
        CHECK_OK(mt_op_attention_backward(dev, d_out, qkv, att, B, T, NH, HD, dqkv.want));
        CHECK_OK(mt_op_attention_backward_into(dev, d_out, qkv, att, B, T, NH, HD, dqkv.got,
                                               flags));
        char what[64];
        snprintf(what, sizeof what, "attention d_qkv, %d x %d", B, T);
        out_check(what, &dqkv, flags);
        out_free(&dqkv);
    }
    mt_status st = mt_op_attention_backward_into(dev, d_out, qkv, att, B, T, NH, HD, qkv,
                                                 MT_OVERWRITE_D_BIAS);
    CHECK_MSG(st == MT_ERR_INVALID_ARG, "attention backward took MT_OVERWRITE_D_BIAS (status %d)",
              (int)st);
    free(qkv);
    free(d_out);
    free(y);
    free(att);
}

int main(void) {
    mt_bf16_gemm_path path = MT_BF16_GEMM_F32;
    CHECK_OK(mt_cpu_bf16_gemm_path(&path, false));
    /* As test_ops_bf16: oneDNN 2.6's bf16 matmul needs AVX-512. */
    if (path == MT_BF16_GEMM_ONEDNN && !mt_cpu_has(MT_CPU_AVX512F)) {
        printf("test_ops_overwrite: skipped: MT_CPU_BF16_GEMM=onednn on a CPU without AVX-512\n");
        return 77;
    }
    printf("test_ops_overwrite: bf16 products on %s\n",
           path == MT_BF16_GEMM_ONEDNN ? "oneDNN" : "widened f32 (sgemm)");
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return check_report("test_ops_overwrite");
    test_linear(dev, 9, 13, 11, MT_F32);
    test_linear(dev, 256, 256, 192, MT_F32); /* the products split into blocks on the pool */
    test_linear(dev, 9, 13, 11, MT_BF16);
    test_linear(dev, 256, 512, 160, MT_BF16); /* one block per product on oneDNN */
    test_linear(dev, 256, 512, 384, MT_BF16); /* 2 blocks of at least 2^24 multiply-adds */
    /* Thin products (a row or a column of C) and no rows at all: the flagged gradients of an
     * empty batch are zeros (sgemm is not called with an inner size of 0). */
    test_linear(dev, 1, 7, 1, MT_F32);
    test_linear(dev, 5, 300, 1, MT_F32);
    test_linear(dev, 0, 13, 11, MT_F32);
    test_linear(dev, 0, 13, 11, MT_BF16);
    test_layernorm(dev, 37);
    test_layernorm(dev, 0);
    test_position(dev, 3);
    test_position(dev, 0);
    test_gelu(dev, 70000); /* several of the pool's chunks and a ragged vector tail */
    test_gelu(dev, 0);
    test_attention(dev, 2, 70);
    test_attention(dev, 3, 9);
    mt_device_close(dev);
    return check_report("test_ops_overwrite");
}
