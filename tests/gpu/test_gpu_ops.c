/* Every compute op (include/meshtrain/ops.h) on the GPU against the CPU implementation, on random
 * inputs of awkward sizes (not multiples of a warp or a block). Tolerances (f32): |gpu - cpu| /
 * max(|cpu|, 1) <= 1e-5 for elementwise ops, <= 1e-4 for reductions, GEMMs and what is built on
 * them (linear, LayerNorm, attention, cross-entropy, MSE). Exits 77 (ctest: skipped) without a
 * GPU. */
#include "check.h"

#include <meshtrain/device.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SKIPPED 77
#define TOL_ELEM 1e-5
#define TOL_RED 1e-4

static mt_device *cpu, *gpu;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double next_unit(void) { /* xorshift64*, uniform in [0, 1) */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

static float *rand_floats(size_t n, float lo, float hi) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) abort();
    for (size_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * (float)next_unit();
    return p;
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
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double den = fabs((double)ref[i]) > 1.0 ? fabs((double)ref[i]) : 1.0;
        double e = fabs((double)back[i] - (double)ref[i]) / den;
        if (!(e <= worst)) { /* also catches NaN */
            worst = e;
            at = i;
        }
    }
    printf("  %-32s n %-8zu max rel err %.3g\n", what, n, worst);
    CHECK_MSG(worst <= tol, "%s: element %zu: gpu %.9g cpu %.9g (err %.3g > %.1g)", what, at,
              n ? (double)back[at] : 0.0, n ? (double)ref[at] : 0.0, worst, tol);
    free(back);
    mt_device_free(gpu, d);
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
    const char *self = getenv("MT_TEST_OPS_SELF");
    bool self_check = self && strcmp(self, "1") == 0;
    char why[256] = "";
    if (!self_check && mt_device_cuda_count(why, sizeof why) == 0) {
        printf("test_gpu_ops: skipped, no GPU (%s)\n", why);
        return SKIPPED;
    }
    CHECK_OK(mt_device_open_cpu(0, &cpu));
    if (self_check) CHECK_OK(mt_device_open_cpu(0, &gpu));
    else CHECK_OK(mt_device_open(MT_DEVICE_CUDA, 0, &gpu));
    if (!cpu || !gpu || (!self_check && mt_device_is_fallback(gpu)))
        return check_report("test_gpu_ops");
    test_gemm();
    test_linear();
    test_relu_mse_adamw();
    test_embeddings();
    test_layernorm(67);
    test_layernorm(1000);
    test_gelu_add();
    test_attention(2, 9, 3, 8);
    test_attention(2, 300, 2, 16); /* rows longer than a block of threads */
    test_xent();
    CHECK_OK(mt_device_synchronize(gpu));
    mt_device_close(gpu);
    mt_device_close(cpu);
    return check_report("test_gpu_ops");
}
