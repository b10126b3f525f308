/* CPU compute ops (core/cpu/ops_cpu.c): each op against a naive double-precision reference on
 * random inputs, the backward ops against finite differences of a double-precision forward, and
 * AdamW against the scalar formula over several steps. */
#include "check.h"
#include "numeric.h"

#include <meshtrain/device.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x1234abcdULL;

/* n values uniform in [-1, 1). */
static float *rnd_vec(size_t n) { return test_lcg_floats(&rng_state, n, 1.0); }

/* ---- gemm ------------------------------------------------------------------------------------ */

static void test_gemm(mt_device *dev) {
    const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 9, 33}, {64, 31, 8}, {2, 40, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        for (int ta = 0; ta < 2; ta++) {
            for (int tb = 0; tb < 2; tb++) {
                float *a = rnd_vec((size_t)m * k), *b = rnd_vec((size_t)k * n);
                float *c = rnd_vec((size_t)m * n);
                double *want = malloc((size_t)m * n * sizeof *want);
                float alpha = 0.75f, beta = -0.5f;
                for (int i = 0; i < m; i++) {
                    for (int j = 0; j < n; j++) {
                        double sum = 0.0;
                        for (int p = 0; p < k; p++) {
                            double av = ta ? a[(size_t)p * m + i] : a[(size_t)i * k + p];
                            double bv = tb ? b[(size_t)j * k + p] : b[(size_t)p * n + j];
                            sum += av * bv;
                        }
                        want[(size_t)i * n + j] = alpha * sum + beta * (double)c[(size_t)i * n + j];
                    }
                }
                CHECK_OK(mt_op_gemm(dev, ta, tb, m, n, k, alpha, a, b, beta, c));
                int bad = 0;
                for (size_t i = 0; i < (size_t)m * n; i++)
                    if (!test_close_to(c[i], want[i], 1e-5, 1e-5)) bad++;
                CHECK_MSG(bad == 0, "gemm %dx%dx%d trans %d%d: %d elements off", m, n, k, ta, tb,
                          bad);
                free(a);
                free(b);
                free(c);
                free(want);
            }
        }
    }
    /* k = 0: only beta applies (BLAS itself would refuse the leading dimension). */
    float c[4] = {1, 2, 3, 4};
    CHECK_OK(mt_op_gemm(dev, false, false, 2, 2, 0, 1.0f, NULL, NULL, 2.0f, c));
    CHECK(c[0] == 2.0f && c[3] == 8.0f);
    /* m = 0: A and C hold no element and may be NULL. */
    CHECK_OK(mt_op_gemm(dev, false, false, 0, 2, 2, 1.0f, NULL, c, 0.0f, NULL));
}

/* ---- linear ---------------------------------------------------------------------------------- */

/* L = sum(out * r) with out = in W^T + bias, in double. */
static double linear_loss(const double *in, const double *w, const double *bias, const double *r,
                          int batch, int nin, int nout) {
    double loss = 0.0;
    for (int i = 0; i < batch; i++) {
        for (int o = 0; o < nout; o++) {
            double y = bias ? bias[o] : 0.0;
            for (int p = 0; p < nin; p++) y += in[(size_t)i * nin + p] * w[(size_t)o * nin + p];
            loss += y * r[(size_t)i * nout + o];
        }
    }
    return loss;
}

/* Central difference of linear_loss with respect to x[i] (x is one of the double arrays). */
static double fd_linear(double *x, size_t i, const double *in, const double *w,
                        const double *bias, const double *r, int batch, int nin, int nout) {
    const double h = 1e-6;
    double keep = x[i];
    x[i] = keep + h;
    double up = linear_loss(in, w, bias, r, batch, nin, nout);
    x[i] = keep - h;
    double down = linear_loss(in, w, bias, r, batch, nin, nout);
    x[i] = keep;
    return (up - down) / (2 * h);
}

static void test_linear(mt_device *dev) {
    const int batch = 5, nin = 7, nout = 4;
    size_t n_in = (size_t)batch * nin, n_w = (size_t)nout * nin, n_out = (size_t)batch * nout;
    float *in = rnd_vec(n_in), *w = rnd_vec(n_w), *bias = rnd_vec(nout), *r = rnd_vec(n_out);
    float *out = rnd_vec(n_out);
    double *din = test_to_double(in, n_in), *dw = test_to_double(w, n_w);
    double *db = test_to_double(bias, nout);
    double *dr = test_to_double(r, n_out);

    /* Forward, with and without bias, against the naive product. */
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        CHECK_OK(mt_op_linear_forward(dev, in, w, with_bias ? bias : NULL, out, batch, nin, nout));
        int bad = 0;
        for (int i = 0; i < batch; i++) {
            for (int o = 0; o < nout; o++) {
                double y = with_bias ? db[o] : 0.0;
                for (int p = 0; p < nin; p++) y += din[(size_t)i * nin + p] * dw[(size_t)o * nin + p];
                if (!test_close_to(out[(size_t)i * nout + o], y, 1e-5, 1e-6)) bad++;
            }
        }
        CHECK_MSG(bad == 0, "linear forward (bias %d): %d outputs off", with_bias, bad);
    }

    /* Backward accumulates onto what is there: start every gradient at 0.25. */
    const float base = 0.25f;
    float *g_in = malloc(n_in * sizeof *g_in), *g_w = malloc(n_w * sizeof *g_w);
    float *g_b = malloc(nout * sizeof *g_b);
    for (size_t i = 0; i < n_in; i++) g_in[i] = base;
    for (size_t i = 0; i < n_w; i++) g_w[i] = base;
    for (int i = 0; i < nout; i++) g_b[i] = base;
    CHECK_OK(mt_op_linear_backward(dev, r, in, w, g_in, g_w, g_b, batch, nin, nout));
    int bad = 0;
    for (size_t i = 0; i < n_in; i++)
        if (!test_close_to(g_in[i] - base, fd_linear(din, i, din, dw, db, dr, batch, nin, nout),
                           1e-4, 1e-6))
            bad++;
    CHECK_MSG(bad == 0, "linear d_in: %d elements off the finite differences", bad);
    bad = 0;
    for (size_t i = 0; i < n_w; i++)
        if (!test_close_to(g_w[i] - base, fd_linear(dw, i, din, dw, db, dr, batch, nin, nout),
                           1e-4, 1e-6))
            bad++;
    CHECK_MSG(bad == 0, "linear d_w: %d elements off the finite differences", bad);
    bad = 0;
    for (int i = 0; i < nout; i++)
        if (!test_close_to(g_b[i] - base,
                           fd_linear(db, (size_t)i, din, dw, db, dr, batch, nin, nout), 1e-4, 1e-6))
            bad++;
    CHECK_MSG(bad == 0, "linear d_bias: %d elements off the finite differences", bad);

    /* d_in and d_bias are optional. */
    CHECK_OK(mt_op_linear_backward(dev, r, in, w, NULL, g_w, NULL, batch, nin, nout));

    free(in), free(w), free(bias), free(r), free(out);
    free(din), free(dw), free(db), free(dr);
    free(g_in), free(g_w), free(g_b);
}

/* ---- relu and mse ---------------------------------------------------------------------------- */

/* A double-precision loss of x against a fixed second array r, both of n elements. */
typedef double (*pair_loss)(const double *x, const double *r, size_t n);

/* Central difference of loss(x, r) with respect to x[i]; x is perturbed in place and restored. */
static double fd_pair(pair_loss loss, double *x, size_t i, const double *r, size_t n) {
    const double h = 1e-6;
    double keep = x[i];
    x[i] = keep + h;
    double up = loss(x, r, n);
    x[i] = keep - h;
    double down = loss(x, r, n);
    x[i] = keep;
    return (up - down) / (2 * h);
}

static double relu_loss(const double *x, const double *r, size_t n) {
    double loss = 0.0;
    for (size_t i = 0; i < n; i++) loss += (x[i] > 0 ? x[i] : 0.0) * r[i];
    return loss;
}

static void test_relu(mt_device *dev) {
    const size_t n = 300;
    float *x = rnd_vec(n), *r = rnd_vec(n), *y = malloc(n * sizeof *y), *g = malloc(n * sizeof *g);
    /* Keep inputs away from the kink, where the finite difference is meaningless. */
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) < 0.01f) x[i] = 0.5f;
    double *dx = test_to_double(x, n), *dr = test_to_double(r, n);
    CHECK_OK(mt_op_relu_forward(dev, x, y, n));
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (y[i] != (x[i] > 0 ? x[i] : 0.0f)) bad++;
    CHECK_MSG(bad == 0, "relu forward: %d outputs off", bad);
    for (size_t i = 0; i < n; i++) g[i] = -1.0f;
    CHECK_OK(mt_op_relu_backward(dev, y, r, g, n));
    bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!test_close_to(g[i] + 1.0, fd_pair(relu_loss, dx, i, dr, n), 1e-5, 1e-6)) bad++;
    CHECK_MSG(bad == 0, "relu backward: %d elements off the finite differences", bad);
    /* In place forward is allowed. */
    CHECK_OK(mt_op_relu_forward(dev, x, x, n));
    CHECK(memcmp(x, y, n * sizeof *x) == 0);
    free(x), free(r), free(y), free(g), free(dx), free(dr);
}

static double mse_loss(const double *p, const double *t, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (p[i] - t[i]) * (p[i] - t[i]);
    return s / (double)n;
}

static void test_mse(mt_device *dev) {
    const size_t n = 123;
    float *p = rnd_vec(n), *t = rnd_vec(n), *g = malloc(n * sizeof *g);
    double *dp = test_to_double(p, n), *dt = test_to_double(t, n);
    float loss = -1.0f;
    CHECK_OK(mt_op_mse_forward(dev, p, t, n, &loss));
    CHECK_MSG(test_close_to(loss, mse_loss(dp, dt, n), 1e-6, 0), "mse %g vs %g", (double)loss,
              mse_loss(dp, dt, n));
    const float scale = 0.25f;
    for (size_t i = 0; i < n; i++) g[i] = 2.0f;
    CHECK_OK(mt_op_mse_backward(dev, p, t, n, scale, g));
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!test_close_to(g[i] - 2.0, scale * fd_pair(mse_loss, dp, i, dt, n), 1e-4, 1e-7)) bad++;
    CHECK_MSG(bad == 0, "mse backward: %d elements off the finite differences", bad);
    CHECK(mt_op_mse_forward(dev, p, t, 0, &loss) == MT_ERR_INVALID_ARG);
    free(p), free(t), free(g), free(dp), free(dt);
}

/* ---- AdamW ----------------------------------------------------------------------------------- */

static void test_adamw(mt_device *dev) {
    const size_t n = 50;
    const float lr = 0.01f, b1 = 0.8f, b2 = 0.95f, eps = 1e-6f, wd = 0.1f;
    float *p = rnd_vec(n), *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);
    double *rp = test_to_double(p, n), *rm = calloc(n, sizeof *rm), *rv = calloc(n, sizeof *rv);
    int bad = 0;
    for (long t = 1; t <= 6; t++) {
        float *g = rnd_vec(n);
        CHECK_OK(mt_op_adamw(dev, p, g, m, v, n, t, lr, b1, b2, eps, wd));
        for (size_t i = 0; i < n; i++) {
            rm[i] = b1 * rm[i] + (1 - b1) * (double)g[i];
            rv[i] = b2 * rv[i] + (1 - b2) * (double)g[i] * g[i];
            double mhat = rm[i] / (1 - pow(b1, (double)t));
            double vhat = rv[i] / (1 - pow(b2, (double)t));
            rp[i] = rp[i] - lr * mhat / (sqrt(vhat) + eps) - (double)lr * wd * rp[i];
        }
        free(g);
    }
    for (size_t i = 0; i < n; i++)
        if (!test_close_to(p[i], rp[i], 1e-5, 1e-6) || !test_close_to(m[i], rm[i], 1e-5, 1e-7) ||
            !test_close_to(v[i], rv[i], 1e-5, 1e-8))
            bad++;
    CHECK_MSG(bad == 0, "adamw: %d elements off the scalar reference after 6 steps", bad);

    /* Zero gradients on zero parameters (FSDP padding) stay exactly zero. */
    float zp[4] = {0}, zg[4] = {0}, zm[4] = {0}, zv[4] = {0};
    CHECK_OK(mt_op_adamw(dev, zp, zg, zm, zv, 4, 1, lr, b1, b2, eps, wd));
    CHECK(zp[0] == 0.0f && zp[3] == 0.0f && zm[1] == 0.0f && zv[2] == 0.0f);

    CHECK(mt_op_adamw(dev, p, p, m, v, n, 0, lr, b1, b2, eps, wd) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_adamw(dev, p, p, m, v, n, 1, lr, 1.0f, b2, eps, wd) == MT_ERR_INVALID_ARG);
    free(p), free(m), free(v), free(rp), free(rm), free(rv);
}

/* ---- argument checks ------------------------------------------------------------------------- */

static void test_errors(mt_device *dev) {
    float x[4] = {0};
    CHECK(mt_op_gemm(NULL, false, false, 1, 1, 1, 1.0f, x, x, 0.0f, x) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "device") != NULL);
    CHECK(mt_op_gemm(dev, false, false, -1, 1, 1, 1.0f, x, x, 0.0f, x) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "negative") != NULL);
    CHECK(mt_op_gemm(dev, false, false, 1, 1, 1, 1.0f, NULL, x, 0.0f, x) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_linear_forward(dev, x, NULL, NULL, x, 1, 1, 1) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "weight") != NULL);
    CHECK(mt_op_linear_backward(dev, x, x, x, x, NULL, NULL, 1, 1, 1) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_relu_forward(dev, NULL, x, 4) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_relu_backward(dev, x, x, NULL, 4) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_mse_backward(dev, x, NULL, 4, 1.0f, x) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_adamw(dev, x, x, NULL, x, 4, 1, 0.1f, 0.9f, 0.99f, 1e-8f, 0.0f) ==
          MT_ERR_INVALID_ARG);
}

int main(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return check_report("test_ops");
    test_gemm(dev);
    test_linear(dev);
    test_relu(dev);
    test_mse(dev);
    test_adamw(dev);
    test_errors(dev);
    mt_device_close(dev);
    return check_report("test_ops");
}
