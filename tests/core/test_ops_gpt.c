/* GPT ops on the CPU (core/cpu/ops_{embed,layernorm,gelu,attention,xent}.c): every forward
 * against a naive double-precision reference on random inputs, every backward against central
 * finite differences of that reference (objective: sum of out * a random weight, so that d_out
 * is that weight), with the
 * gradient buffers prefilled to check that backward accumulates. The vocabulary-parallel
 * cross-entropy is also run as two slices combined the way the tp layer combines them, and must
 * match the full softmax cross-entropy, also for logits far from 0. */
#include "core/ops_internal.h"

#include "check.h"
#include "numeric.h"

#include <meshtrain/device.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 5, C = 8, NH = 2, HD = 4, N = B * T };

static uint64_t rng_state = 0x5eed6a7ULL;

/* Uniform in [-1, 1). */
static double rnd(void) { return test_lcg_pm1(&rng_state); }

static float *rnd_vec(size_t n, double amp) { return test_lcg_floats(&rng_state, n, amp); }

/* Counts the elements of got (minus a prefilled base, when given) that differ from want. */
static int count_off(const float *got, const float *base, const double *want, size_t n, double rel,
                     double abs_tol) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double g = (double)got[i] - (base ? (double)base[i] : 0.0);
        if (!test_close_to(g, want[i], rel, abs_tol)) {
            if (bad < 3) fprintf(stderr, "  [%zu] got %.8g want %.8g\n", i, g, want[i]);
            bad++;
        }
    }
    return bad;
}

/* A double reference forward over a mutable parameter vector: fills out (n_out values). */
typedef void (*ref_fn)(void *ctx, double *out);

/* d objective / d x[i] by central differences, objective = sum out * w. x is one of the
 * reference's inputs, perturbed in place and restored. */
static void finite_diff(ref_fn f, void *ctx, double *x, size_t nx, const double *w, size_t n_out,
                        double *grad) {
    const double h = 1e-5;
    double *out = malloc(n_out * sizeof *out);
    for (size_t i = 0; i < nx; i++) {
        double keep = x[i], plus = 0.0, minus = 0.0;
        x[i] = keep + h;
        f(ctx, out);
        for (size_t k = 0; k < n_out; k++) plus += out[k] * w[k];
        x[i] = keep - h;
        f(ctx, out);
        for (size_t k = 0; k < n_out; k++) minus += out[k] * w[k];
        x[i] = keep;
        grad[i] = (plus - minus) / (2.0 * h);
    }
    free(out);
}

/* ---- embeddings ------------------------------------------------------------------------------ */

static void test_embedding(mt_device *dev) {
    enum { V = 10, START = 3, LOCAL = 4 };
    int ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int)((rnd() + 1.0) * 0.5 * V) % V;
    ids[0] = START;              /* first row of the slice */
    ids[1] = START + LOCAL - 1;  /* last row of the slice */
    ids[2] = START + LOCAL;      /* just past it */
    ids[3] = START - 1;          /* just before it */
    ids[4] = -1;                 /* outside any vocabulary */
    float *wte_full = rnd_vec((size_t)V * C, 1.0);
    const float *wte = wte_full + (size_t)START * C;

    float *out = rnd_vec((size_t)N * C, 1.0);
    CHECK_OK(mt_op_embedding_forward(dev, ids, N, wte, START, LOCAL, C, out, false));
    int bad = 0;
    for (int i = 0; i < N; i++) {
        bool in = ids[i] >= START && ids[i] < START + LOCAL;
        for (int c = 0; c < C; c++) {
            float want = in ? wte_full[(size_t)ids[i] * C + c] : 0.0f;
            if (out[(size_t)i * C + c] != want) bad++;
        }
    }
    CHECK_MSG(bad == 0, "embedding forward: %d values off (ids outside the slice give 0)", bad);

    /* The slices [0,3), [3,7), [7,10) with accumulate sum to the full lookup. */
    const int starts[] = {0, START, START + LOCAL}, sizes[] = {START, LOCAL, V - START - LOCAL};
    float *sum = calloc((size_t)N * C, sizeof *sum);
    for (int s = 0; s < 3; s++)
        CHECK_OK(mt_op_embedding_forward(dev, ids, N, wte_full + (size_t)starts[s] * C, starts[s],
                                         sizes[s], C, sum, true));
    bad = 0;
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) {
            float want = ids[i] >= 0 && ids[i] < V ? wte_full[(size_t)ids[i] * C + c] : 0.0f;
            if (sum[(size_t)i * C + c] != want) bad++;
        }
    CHECK_MSG(bad == 0, "embedding: the slices' accumulated outputs miss the full lookup (%d)",
              bad);

    /* Backward: d_wte[row] += d_out for the ids in the slice (the op is linear: exact sums). */
    float *d_out = rnd_vec((size_t)N * C, 1.0);
    float *d_wte = rnd_vec((size_t)LOCAL * C, 1.0);
    float *d_wte0 = test_copy_floats(d_wte, (size_t)LOCAL * C);
    double want[LOCAL * C];
    memset(want, 0, sizeof want);
    for (int i = 0; i < N; i++)
        if (ids[i] >= START && ids[i] < START + LOCAL)
            for (int c = 0; c < C; c++)
                want[(size_t)(ids[i] - START) * C + c] += d_out[(size_t)i * C + c];
    CHECK_OK(mt_op_embedding_backward(dev, ids, N, d_out, START, LOCAL, C, d_wte));
    bad = count_off(d_wte, d_wte0, want, (size_t)LOCAL * C, 1e-6, 1e-6);
    CHECK_MSG(bad == 0, "embedding backward: %d values off", bad);

    free(wte_full);
    free(out);
    free(sum);
    free(d_out);
    free(d_wte);
    free(d_wte0);
}

static void test_position(mt_device *dev) {
    float *wpe = rnd_vec((size_t)T * C, 1.0);
    float *out = rnd_vec((size_t)N * C, 1.0);
    float *out0 = test_copy_floats(out, (size_t)N * C);
    CHECK_OK(mt_op_position_forward(dev, wpe, B, T, C, out));
    double want[N * C];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                want[((size_t)b * T + t) * C + c] = wpe[(size_t)t * C + c];
    CHECK_MSG(count_off(out, out0, want, (size_t)N * C, 1e-6, 1e-6) == 0,
              "position forward: out[b,t] += wpe[t] broken");

    float *d_out = rnd_vec((size_t)N * C, 1.0);
    float *d_wpe = rnd_vec((size_t)T * C, 1.0);
    float *d_wpe0 = test_copy_floats(d_wpe, (size_t)T * C);
    double dw[T * C];
    memset(dw, 0, sizeof dw);
    for (int b = 0; b < B; b++)
        for (size_t i = 0; i < (size_t)T * C; i++) dw[i] += d_out[(size_t)b * T * C + i];
    CHECK_OK(mt_op_position_backward(dev, d_out, B, T, C, d_wpe));
    CHECK_MSG(count_off(d_wpe, d_wpe0, dw, (size_t)T * C, 1e-6, 1e-6) == 0,
              "position backward: d_wpe[t] += sum over b broken");
    free(wpe);
    free(out);
    free(out0);
    free(d_out);
    free(d_wpe);
    free(d_wpe0);
}

/* ---- LayerNorm ------------------------------------------------------------------------------- */

typedef struct {
    double *x, *gamma, *beta;
} ln_ctx;

static void ref_layernorm(void *p, double *out) {
    ln_ctx *c = p;
    for (int i = 0; i < N; i++) {
        const double *x = c->x + (size_t)i * C;
        double m = 0.0, v = 0.0;
        for (int j = 0; j < C; j++) m += x[j];
        m /= C;
        for (int j = 0; j < C; j++) v += (x[j] - m) * (x[j] - m);
        v /= C;
        double rs = 1.0 / sqrt(v + 1e-5);
        for (int j = 0; j < C; j++)
            out[(size_t)i * C + j] = (x[j] - m) * rs * c->gamma[j] + c->beta[j];
    }
}

static void test_layernorm(mt_device *dev) {
    size_t nx = (size_t)N * C;
    float *x = rnd_vec(nx, 2.0), *gamma = rnd_vec(C, 1.0), *beta = rnd_vec(C, 1.0);
    for (int j = 0; j < C; j++) x[j] += 50.0f; /* a row far from 0: the mean must cancel */
    float *out = malloc(nx * sizeof *out), mean[N], rstd[N];
    CHECK_OK(mt_op_layernorm_forward(dev, x, gamma, beta, N, C, out, mean, rstd));
    ln_ctx ctx = {test_to_double(x, nx), test_to_double(gamma, C), test_to_double(beta, C)};
    double *want = malloc(nx * sizeof *want);
    ref_layernorm(&ctx, want);
    CHECK_MSG(count_off(out, NULL, want, nx, 1e-4, 1e-4) == 0, "layernorm forward off");
    int bad = 0;
    for (int i = 0; i < N; i++) {
        double m = 0.0, v = 0.0;
        for (int j = 0; j < C; j++) m += ctx.x[(size_t)i * C + j];
        m /= C;
        for (int j = 0; j < C; j++) v += pow(ctx.x[(size_t)i * C + j] - m, 2);
        if (!test_close_to(mean[i], m, 1e-6, 1e-6) ||
            !test_close_to(rstd[i], 1.0 / sqrt(v / C + 1e-5), 1e-5, 1e-6))
            bad++;
    }
    CHECK_MSG(bad == 0, "layernorm: saved mean/rstd off in %d rows", bad);

    float *d_out = rnd_vec(nx, 1.0);
    double *w = test_to_double(d_out, nx);
    float *d_x = rnd_vec(nx, 1.0), *d_g = rnd_vec(C, 1.0), *d_b = rnd_vec(C, 1.0);
    float *d_x0 = test_copy_floats(d_x, nx), *d_g0 = test_copy_floats(d_g, C);
    float *d_b0 = test_copy_floats(d_b, C);
    CHECK_OK(mt_op_layernorm_backward(dev, d_out, x, gamma, mean, rstd, N, C, d_x, d_g, d_b));
    double *fd = malloc(nx * sizeof *fd);
    finite_diff(ref_layernorm, &ctx, ctx.x, nx, w, nx, fd);
    CHECK_MSG(count_off(d_x, d_x0, fd, nx, 1e-3, 1e-4) == 0, "layernorm backward: d_in off");
    finite_diff(ref_layernorm, &ctx, ctx.gamma, C, w, nx, fd);
    CHECK_MSG(count_off(d_g, d_g0, fd, C, 1e-3, 1e-4) == 0, "layernorm backward: d_gamma off");
    finite_diff(ref_layernorm, &ctx, ctx.beta, C, w, nx, fd);
    CHECK_MSG(count_off(d_b, d_b0, fd, C, 1e-3, 1e-4) == 0, "layernorm backward: d_beta off");

    free(x), free(gamma), free(beta), free(out), free(want), free(d_out), free(w);
    free(d_x), free(d_g), free(d_b), free(d_x0), free(d_g0), free(d_b0), free(fd);
    free(ctx.x), free(ctx.gamma), free(ctx.beta);
}

/* ---- GELU, add ------------------------------------------------------------------------------- */

typedef struct {
    double *x;
    size_t n;
} gelu_ctx;

static void ref_gelu(void *p, double *out) {
    gelu_ctx *c = p;
    for (size_t i = 0; i < c->n; i++) {
        double x = c->x[i];
        out[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    }
}

static void test_gelu(mt_device *dev) {
    size_t n = (size_t)N * C;
    float *x = rnd_vec(n, 4.0);
    x[0] = 12.0f, x[1] = -12.0f, x[2] = 0.0f; /* saturated tails and the origin */
    float *out = malloc(n * sizeof *out);
    CHECK_OK(mt_op_gelu_forward(dev, x, out, n));
    gelu_ctx ctx = {test_to_double(x, n), n};
    double *want = malloc(n * sizeof *want);
    ref_gelu(&ctx, want);
    CHECK_MSG(count_off(out, NULL, want, n, 1e-5, 1e-6) == 0, "gelu forward off");

    float *d_out = rnd_vec(n, 1.0), *d_x = rnd_vec(n, 1.0), *d_x0 = test_copy_floats(d_x, n);
    double *w = test_to_double(d_out, n), *fd = malloc(n * sizeof *fd);
    CHECK_OK(mt_op_gelu_backward(dev, x, d_out, d_x, n));
    finite_diff(ref_gelu, &ctx, ctx.x, n, w, n, fd);
    CHECK_MSG(count_off(d_x, d_x0, fd, n, 1e-4, 1e-5) == 0, "gelu backward off");
    free(x), free(out), free(want), free(d_out), free(d_x), free(d_x0), free(w), free(fd);
    free(ctx.x);
}

static void test_add(mt_device *dev) {
    size_t n = 37;
    float *a = rnd_vec(n, 1.0), *b = rnd_vec(n, 1.0), *out = malloc(n * sizeof *out);
    double want[37];
    for (size_t i = 0; i < n; i++) want[i] = (double)a[i] + (double)b[i];
    CHECK_OK(mt_op_add(dev, a, b, out, n));
    CHECK_MSG(count_off(out, NULL, want, n, 1e-6, 1e-7) == 0, "add off");
    CHECK_OK(mt_op_add(dev, a, b, a, n)); /* out aliasing a: the residual stream in place */
    CHECK_MSG(count_off(a, NULL, want, n, 1e-6, 1e-7) == 0, "add in place off");
    free(a), free(b), free(out);
}

/* ---- attention ------------------------------------------------------------------------------- */

typedef struct {
    double *qkv;
    double *att; /* B * NH * T * T, filled by the reference */
} att_ctx;

static void ref_attention(void *p, double *out) {
    att_ctx *c = p;
    const int W = NH * HD;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = c->qkv + ((size_t)b * T + t) * 3 * W + h * HD;
                double s[T], mx = -INFINITY, sum = 0.0;
                for (int u = 0; u <= t; u++) {
                    const double *k = c->qkv + ((size_t)b * T + u) * 3 * W + W + h * HD;
                    s[u] = 0.0;
                    for (int i = 0; i < HD; i++) s[u] += q[i] * k[i];
                    s[u] /= sqrt((double)HD);
                    if (s[u] > mx) mx = s[u];
                }
                for (int u = 0; u <= t; u++) sum += (s[u] = exp(s[u] - mx));
                double *a = c->att + (((size_t)b * NH + h) * T + t) * T;
                for (int u = 0; u < T; u++) a[u] = u <= t ? s[u] / sum : 0.0;
                double *o = out + ((size_t)b * T + t) * W + h * HD;
                for (int i = 0; i < HD; i++) {
                    o[i] = 0.0;
                    for (int u = 0; u <= t; u++)
                        o[i] += a[u] * c->qkv[((size_t)b * T + u) * 3 * W + 2 * W + h * HD + i];
                }
            }
}

static void test_attention(mt_device *dev) {
    const size_t W = NH * HD, nqkv = (size_t)N * 3 * W, nout = (size_t)N * W;
    const size_t natt = (size_t)B * NH * T * T;
    float *qkv = rnd_vec(nqkv, 1.5), *out = malloc(nout * sizeof *out);
    float *att = rnd_vec(natt, 1.0); /* garbage above the diagonal must be overwritten */
    CHECK_OK(mt_op_attention_forward(dev, qkv, B, T, NH, HD, out, att));
    att_ctx ctx = {test_to_double(qkv, nqkv), malloc(natt * sizeof(double))};
    double *want = malloc(nout * sizeof *want);
    ref_attention(&ctx, want);
    CHECK_MSG(count_off(out, NULL, want, nout, 1e-5, 1e-5) == 0, "attention forward: out off");
    CHECK_MSG(count_off(att, NULL, ctx.att, natt, 1e-5, 1e-6) == 0,
              "attention forward: probabilities off (or not causal)");

    float *d_out = rnd_vec(nout, 1.0), *d_qkv = rnd_vec(nqkv, 1.0);
    float *d_qkv0 = test_copy_floats(d_qkv, nqkv);
    double *w = test_to_double(d_out, nout), *fd = malloc(nqkv * sizeof *fd);
    CHECK_OK(mt_op_attention_backward(dev, d_out, qkv, att, B, T, NH, HD, d_qkv));
    finite_diff(ref_attention, &ctx, ctx.qkv, nqkv, w, nout, fd);
    CHECK_MSG(count_off(d_qkv, d_qkv0, fd, nqkv, 1e-3, 1e-4) == 0,
              "attention backward: d_qkv off");
    free(qkv), free(out), free(att), free(want), free(d_out), free(d_qkv), free(d_qkv0);
    free(w), free(fd), free(ctx.qkv), free(ctx.att);
}

/* The backward reads only the causal half: NaN in att above the diagonal changes no bit of d_qkv,
 * and an Inf in V at position P (whose dot products with earlier dy rows sit in the masked half
 * of dY V^T) changes no bit of d_V nor of d_Q at positions before P. A softmax backward that
 * multiplied the masked entries by their zero probabilities would make those rows NaN. T 13 >
 * the backward's 8 lanes, with a tail. */
static void test_attention_masked(mt_device *dev) {
    enum { TL = 13, P = 6 };
    const size_t W = NH * HD, nqkv = (size_t)B * TL * 3 * W, nout = (size_t)B * TL * W;
    const size_t natt = (size_t)B * NH * TL * TL;
    float *qkv = rnd_vec(nqkv, 1.5), *out = malloc(nout * sizeof *out);
    float *att = malloc(natt * sizeof *att), *d_out = rnd_vec(nout, 1.0);
    float *want = calloc(nqkv, sizeof *want), *got = calloc(nqkv, sizeof *got);
    CHECK_OK(mt_op_attention_forward(dev, qkv, B, TL, NH, HD, out, att));
    CHECK_OK(mt_op_attention_backward(dev, d_out, qkv, att, B, TL, NH, HD, want));
    for (size_t r = 0; r < (size_t)B * NH * TL; r++)
        for (size_t u = r % TL + 1; u < TL; u++) att[r * TL + u] = NAN;
    CHECK_OK(mt_op_attention_backward(dev, d_out, qkv, att, B, TL, NH, HD, got));
    CHECK_MSG(memcmp(got, want, nqkv * sizeof *got) == 0,
              "attention backward: NaN above att's diagonal changed d_qkv");

    for (int b = 0; b < B; b++) /* every V of position P */
        for (size_t i = 0; i < W; i++) qkv[((size_t)b * TL + P) * 3 * W + 2 * W + i] = INFINITY;
    memset(got, 0, nqkv * sizeof *got);
    CHECK_OK(mt_op_attention_backward(dev, d_out, qkv, att, B, TL, NH, HD, got));
    int differ = 0, nonfinite = 0;
    for (size_t row = 0; row < (size_t)B * TL; row++) {
        const float *g = got + row * 3 * W, *w = want + row * 3 * W;
        if (row % TL < P && memcmp(g, w, W * sizeof *g) != 0) differ++; /* d_Q before P */
        if (memcmp(g + 2 * W, w + 2 * W, W * sizeof *g) != 0) differ++;  /* d_V */
        for (size_t i = 0; i < 3 * W; i++) nonfinite += !isfinite(g[i]);
    }
    CHECK_MSG(differ == 0, "attention backward: an Inf in V at position %d changed %d rows of "
              "d_Q before it or of d_V", P, differ);
    CHECK_MSG(nonfinite > 0, "attention backward: an Inf in V left every gradient finite");
    free(qkv), free(out), free(att), free(d_out), free(want), free(got);
}

/* A sequence of 150 positions: the backward's products run in blocks of 64 rows and columns
 * (core/cpu/ops_attention.c), the last one ragged. d_qkv (prefilled: it accumulates) against the
 * backward's formula in double on the same att; then an Inf in K at position 100 (the second
 * block) must leave d_Q of the first block's positions bit for bit as they were. */
static void test_attention_blocks(mt_device *dev) {
    enum { BL = 1, TL = 150, KINF = 100, FIRST_BLOCK = 64 };
    const size_t W = NH * HD, nqkv = (size_t)BL * TL * 3 * W, nout = (size_t)BL * TL * W;
    const size_t natt = (size_t)BL * NH * TL * TL;
    float *qkv = rnd_vec(nqkv, 1.5), *out = malloc(nout * sizeof *out);
    float *att = malloc(natt * sizeof *att), *d_out = rnd_vec(nout, 1.0);
    float *got = rnd_vec(nqkv, 1.0), *base = test_copy_floats(got, nqkv);
    double *want = calloc(nqkv, sizeof *want);
    CHECK_OK(mt_op_attention_forward(dev, qkv, BL, TL, NH, HD, out, att));
    CHECK_OK(mt_op_attention_backward(dev, d_out, qkv, att, BL, TL, NH, HD, got));
    const double scale = 1.0 / sqrt((double)HD);
    for (int h = 0; h < NH; h++)
        for (size_t t = 0; t < TL; t++) {
            const float *a = att + ((size_t)h * TL + t) * TL, *dy = d_out + t * W + h * HD;
            const float *qt = qkv + t * 3 * W + h * HD;
            double datt[TL], adot = 0.0;
            for (size_t u = 0; u <= t; u++) {
                const float *vu = qkv + u * 3 * W + 2 * W + h * HD;
                datt[u] = 0.0;
                for (int i = 0; i < HD; i++) datt[u] += (double)dy[i] * vu[i];
                adot += a[u] * datt[u];
            }
            for (size_t u = 0; u <= t; u++) {
                double dpre = a[u] * (datt[u] - adot) * scale;
                const float *ku = qkv + u * 3 * W + W + h * HD;
                for (int i = 0; i < HD; i++) {
                    want[t * 3 * W + h * HD + i] += dpre * ku[i];
                    want[u * 3 * W + W + h * HD + i] += dpre * qt[i];
                    want[u * 3 * W + 2 * W + h * HD + i] += (double)a[u] * dy[i];
                }
            }
        }
    CHECK_MSG(count_off(got, base, want, nqkv, 1e-4, 1e-5) == 0,
              "attention backward, 150 positions: d_qkv off the formula");

    float *inf = calloc(nqkv, sizeof *inf);
    memset(got, 0, nqkv * sizeof *got);
    CHECK_OK(mt_op_attention_backward(dev, d_out, qkv, att, BL, TL, NH, HD, got));
    for (size_t i = 0; i < W; i++) qkv[KINF * 3 * W + W + i] = INFINITY;
    CHECK_OK(mt_op_attention_backward(dev, d_out, qkv, att, BL, TL, NH, HD, inf));
    int differ = 0;
    for (size_t t = 0; t < FIRST_BLOCK; t++)
        differ += memcmp(inf + t * 3 * W, got + t * 3 * W, W * sizeof *inf) != 0;
    CHECK_MSG(differ == 0, "attention backward: an Inf in K at position %d changed d_Q at %d of "
              "the first %d positions", KINF, differ, FIRST_BLOCK);
    free(qkv), free(out), free(att), free(d_out), free(got), free(base), free(want), free(inf);
}

/* ---- cross-entropy --------------------------------------------------------------------------- */

enum { V = 11 };

typedef struct {
    double *logits;
    const int *targets;
} xent_ctx;

/* Per-row loss of the full softmax cross-entropy (log-sum-exp with the maximum subtracted). */
static void ref_xent(void *p, double *loss) {
    xent_ctx *c = p;
    for (int i = 0; i < N; i++) {
        const double *l = c->logits + (size_t)i * V;
        double mx = -INFINITY, s = 0.0;
        for (int j = 0; j < V; j++) mx = l[j] > mx ? l[j] : mx;
        for (int j = 0; j < V; j++) s += exp(l[j] - mx);
        loss[i] = log(s) + mx - l[c->targets[i]];
    }
}

/* The three local steps over slices of the vocabulary, combined as the tp all-reduces would
 * combine them (max, then sums); loss and d_logits come back in the full layout. */
static void xent_sliced(mt_device *dev, const float *logits, const int *targets, int nslices,
                        const int *starts, float scale, float *loss, float *d_logits) {
    float gmax[N], gsum[N], gtarget[N], part_max[N], part_sum[N], part_t[N];
    float *slice[4], *dslice[4];
    for (int i = 0; i < N; i++) gmax[i] = -INFINITY, gsum[i] = 0.0f, gtarget[i] = 0.0f;
    for (int s = 0; s < nslices; s++) {
        int vl = starts[s + 1] - starts[s];
        slice[s] = malloc((size_t)N * vl * sizeof(float) + 1);
        dslice[s] = malloc((size_t)N * vl * sizeof(float) + 1);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < vl; j++) {
                slice[s][(size_t)i * vl + j] = logits[(size_t)i * V + starts[s] + j];
                dslice[s][(size_t)i * vl + j] = d_logits[(size_t)i * V + starts[s] + j];
            }
        CHECK_OK(mt_op_xent_local_max(dev, slice[s], N, vl, part_max));
        for (int i = 0; i < N; i++) gmax[i] = part_max[i] > gmax[i] ? part_max[i] : gmax[i];
    }
    for (int s = 0; s < nslices; s++) {
        int vl = starts[s + 1] - starts[s];
        CHECK_OK(mt_op_xent_local_sums(dev, slice[s], targets, N, starts[s], vl, gmax, part_sum,
                                       part_t));
        for (int i = 0; i < N; i++) gsum[i] += part_sum[i], gtarget[i] += part_t[i];
    }
    for (int s = 0; s < nslices; s++) {
        int vl = starts[s + 1] - starts[s];
        CHECK_OK(mt_op_xent_loss_backward(dev, slice[s], targets, N, starts[s], vl, gmax, gsum,
                                          gtarget, scale, loss, dslice[s]));
        for (int i = 0; i < N; i++)
            for (int j = 0; j < vl; j++)
                d_logits[(size_t)i * V + starts[s] + j] = dslice[s][(size_t)i * vl + j];
        free(slice[s]);
        free(dslice[s]);
    }
}

static void test_xent(mt_device *dev, double offset) {
    const size_t nl = (size_t)N * V;
    float *logits = rnd_vec(nl, 3.0);
    for (size_t i = 0; i < nl; i++) logits[i] += (float)offset;
    int targets[N];
    for (int i = 0; i < N; i++) targets[i] = (int)((rnd() + 1.0) * 0.5 * V) % V;
    targets[0] = 0, targets[1] = V - 1, targets[2] = 4, targets[3] = 5; /* slice edges */
    xent_ctx ctx = {test_to_double(logits, nl), targets};
    double want[N], w[N], *fd = malloc(nl * sizeof *fd);
    ref_xent(&ctx, want);
    const float scale = 1.0f / N;
    for (int i = 0; i < N; i++) w[i] = scale;
    finite_diff(ref_xent, &ctx, ctx.logits, nl, w, N, fd);

    const int one[] = {0, V}, two[] = {0, 5, V}, three[] = {0, 1, 6, V};
    const int *splits[] = {one, two, three};
    for (int k = 0; k < 3; k++) {
        float loss[N], *d = rnd_vec(nl, 1.0), *d0 = test_copy_floats(d, nl);
        xent_sliced(dev, logits, targets, k + 1, splits[k], scale, loss, d);
        CHECK_MSG(count_off(loss, NULL, want, N, 1e-5, 1e-5) == 0,
                  "xent over %d slices (logits + %g): loss off", k + 1, offset);
        /* With logits near 1000 the float inputs themselves carry ~6e-5 error. */
        double tol = offset != 0.0 ? 2e-4 : 1e-4;
        CHECK_MSG(count_off(d, d0, fd, nl, 1e-3, tol) == 0,
                  "xent over %d slices (logits + %g): d_logits off", k + 1, offset);
        free(d), free(d0);
    }
    free(logits), free(ctx.logits), free(fd);
}

/* ---- argument checks ------------------------------------------------------------------------- */

static void test_errors(mt_device *dev) {
    float buf[64] = {0}, m[4], r[4];
    int ids[4] = {0, 1, 2, 3};
    CHECK(mt_op_gelu_forward(NULL, buf, buf, 4) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_add(dev, NULL, buf, buf, 4) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_add(dev, NULL, NULL, NULL, 0) == MT_OK);
    CHECK(mt_op_embedding_forward(dev, ids, 4, buf, -1, 4, 2, buf, false) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_position_forward(dev, buf, 1, -2, 2, buf) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_layernorm_forward(dev, buf, buf, buf, 4, 0, buf, m, r) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_attention_forward(dev, buf, 1, 2, 1, 0, buf, buf) == MT_ERR_INVALID_ARG);
    CHECK(mt_op_attention_backward(dev, buf, buf, NULL, 1, 2, 1, 2, buf) == MT_ERR_INVALID_ARG);
    /* A sum of 0 means the all-reduce was skipped: refused rather than log(0). */
    float zero[1] = {0.0f}, one_[1] = {1.0f}, loss[1];
    CHECK(mt_op_xent_loss_backward(dev, buf, ids, 1, 0, 4, zero, zero, zero, 1.0f, loss, buf) ==
          MT_ERR_INVALID_ARG);
    CHECK(mt_op_xent_loss_backward(dev, buf, ids, 1, 0, 4, zero, one_, zero, 1.0f, loss, NULL) ==
          MT_OK);
    CHECK(fabsf(loss[0]) < 1e-6f);
    float ninf[1] = {-INFINITY}, s[1], t[1];
    CHECK(mt_op_xent_local_sums(dev, buf, ids, 1, 0, 4, ninf, s, t) == MT_ERR_INVALID_ARG);
    /* An empty slice: max -inf (the identity of the MAX all-reduce). */
    CHECK_OK(mt_op_xent_local_max(dev, buf, 1, 0, m));
    CHECK(isinf(m[0]) && m[0] < 0.0f);
}

int main(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return check_report("test_ops_gpt");
    test_embedding(dev);
    test_position(dev);
    test_layernorm(dev);
    test_gelu(dev);
    test_add(dev);
    test_attention(dev);
    test_attention_masked(dev);
    test_attention_blocks(dev);
    test_xent(dev, 0.0);
    test_xent(dev, 1000.0);
    test_errors(dev);
    mt_device_close(dev);
    /* The same ops on a GPU are compared with these in tests/gpu/test_gpu_ops.c. */
    return check_report("test_ops_gpt");
}
