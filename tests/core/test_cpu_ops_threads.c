/* The CPU GPT ops split over the rank's pool (core/cpu/ops_*.c) give the same bits whatever the
 * pool's size: each op runs in a child process with MT_NUM_THREADS = 1, 2, 3 and 7 (the pool is
 * made once per process), on shapes that cut into several chunks with ragged ends, and every
 * output must match the 1-thread run bit for bit. The 1-thread run is also checked against the
 * single-threaded loops the ops were before they were split (copied below, so that a change of
 * the kernels cannot move the reference with them): bit for bit, except GELU, whose vectorised
 * tanh must stay within 3e-6 * (1 + |reference|) of libm's tanhf formula (docs/cpu-kernels.md).
 * The GELU kernels of every vector width this CPU runs give the same bits, specials included, and
 * so do the sum-of-squares kernels.
 * Matrix products (blocks of C cut by shape on the pool, each on one thread of OpenBLAS or of
 * oneDNN's f32 matmul, as core/cpu/f32_gemm_path.h and MT_CPU_F32_GEMM choose) must stay
 * within 3e-5 relative of one single-threaded sgemm call (the blocks' tiles may round otherwise),
 * and the sum of squares must give the bits of its fixed chunked order. The cross-entropy's
 * vectorised row maximum must give the loop's bits on rows of NaNs, signed zeros and
 * infinities too. bf16 products (on oneDNN on CPUs with AVX-512, unless MT_CPU_BF16_GEMM says
 * otherwise) stay within 3e-5 of sgemm on the widened values, and must leave the process with
 * no more threads than before them. */
#include "check.h"
#include "numeric.h"

#include "core/cpu/cpu_features.h"
#include "core/cpu/gelu_kernels.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/parallel.h"
#include "core/cpu/sum_squares.h"
#include "core/ops_internal.h"

#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/ops.h>

#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Rows 70 of 300 channels: several row chunks, 3 column chunks (the last ragged); 4C = 1200 so
 * that the elementwise ops run 6 chunks of 16384. */
enum { B = 7, T = 10, R = B * T, C = 300, C4 = 4 * C, EL = R * C4 };
enum { VOCAB_START = 5, VOCAB_LOCAL = 25, AB = 2, AT = 9, NH = 3, HD = 8, XV = 300 };
enum { AT_LONG = 150 }; /* one sequence; its att (NH x 150 x 150) fits the EL-float buffers */
_Static_assert(AT_LONG >= AB * AT && (size_t)NH * AT_LONG * AT_LONG <= (size_t)EL,
               "the attention buffers are sized for the long case");

/* One output of one op: name, floats, whether the old loop's bits are required, else the
 * tolerance relative to 1 + |reference|. */
typedef struct seg {
    const char *name;
    size_t n;
    bool exact;
    double tol;
    float *data;
} seg;

enum { MAX_SEGS = 64 };
typedef struct record {
    seg s[MAX_SEGS];
    int count;
} record;

static void put(record *r, const char *name, const float *data, size_t n, bool exact) {
    if (r->count >= MAX_SEGS) {
        CHECK_MSG(false, "more than %d outputs recorded: raise MAX_SEGS", MAX_SEGS);
        return;
    }
    seg *s = &r->s[r->count++];
    s->name = name;
    s->n = n;
    s->exact = exact;
    s->tol = 3e-6;
    s->data = malloc(n * sizeof(float));
    CHECK(s->data != NULL);
    memcpy(s->data, data, n * sizeof(float));
}

/* ---- the single-threaded loops the ops were ------------------------------------------------- */

static long ref_row(int id) {
    long r = (long)id - VOCAB_START;
    return (r >= 0 && r < VOCAB_LOCAL) ? r : -1;
}

static void ref_embedding(const int *ids, const float *wte, float *out, float *d_wte,
                          const float *d_out) {
    for (size_t i = 0; i < R; i++) {
        long r = ref_row(ids[i]);
        for (size_t j = 0; j < C; j++) out[i * C + j] = r < 0 ? 0.0f : wte[r * C + j];
    }
    for (size_t i = 0; i < R; i++) {
        long r = ref_row(ids[i]);
        if (r < 0) continue;
        for (size_t j = 0; j < C; j++) d_wte[r * C + j] += d_out[i * C + j];
    }
}

static void ref_position(const float *wpe, float *out, const float *d_out, float *d_wpe) {
    for (size_t b = 0; b < B; b++)
        for (size_t i = 0; i < (size_t)T * C; i++) out[b * T * C + i] += wpe[i];
    for (size_t b = 0; b < B; b++)
        for (size_t i = 0; i < (size_t)T * C; i++) d_wpe[i] += d_out[b * T * C + i];
}

static void ref_layernorm(const float *in, const float *g, const float *be, float *out,
                          float *mean, float *rstd, const float *dy_all, float *d_in, float *dg,
                          float *db) {
    for (size_t i = 0; i < R; i++) {
        const float *x = in + i * C;
        double m = 0.0, v = 0.0;
        for (size_t j = 0; j < C; j++) m += x[j];
        m /= (double)C;
        for (size_t j = 0; j < C; j++) v += (x[j] - m) * (x[j] - m);
        v /= (double)C;
        float mf = (float)m, rs = (float)(1.0 / sqrt(v + 1e-5));
        for (size_t j = 0; j < C; j++) out[i * C + j] = (x[j] - mf) * rs * g[j] + be[j];
        mean[i] = mf;
        rstd[i] = rs;
    }
    for (size_t i = 0; i < R; i++) {
        const float *x = in + i * C, *dy = dy_all + i * C;
        float m = mean[i], rs = rstd[i];
        double dn_mean = 0.0, dn_norm_mean = 0.0;
        for (size_t j = 0; j < C; j++) {
            double norm = (double)((x[j] - m) * rs), dn = (double)g[j] * dy[j];
            dn_mean += dn;
            dn_norm_mean += dn * norm;
        }
        dn_mean /= (double)C;
        dn_norm_mean /= (double)C;
        for (size_t j = 0; j < C; j++) {
            float norm = (x[j] - m) * rs, dn = g[j] * dy[j];
            db[j] += dy[j];
            dg[j] += norm * dy[j];
            d_in[i * C + j] += (float)(((double)dn - dn_mean - (double)norm * dn_norm_mean) * rs);
        }
    }
}

static void ref_gelu(const float *in, float *out, const float *d_out, float *d_in) {
    const float k = 0.7978845608028654f, c = 0.044715f;
    for (size_t i = 0; i < EL; i++) {
        float x = in[i], th = tanhf(k * (x + c * x * x * x));
        out[i] = 0.5f * x * (1.0f + th);
        float grad =
            0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * k * (1.0f + 3.0f * c * x * x);
        d_in[i] += grad * d_out[i];
    }
}

static float dotf(const float *a, const float *b, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void ref_attention(size_t nb, size_t t_n, const float *qkv, float *out, float *att,
                          const float *d_out, float *d_qkv) {
    const size_t w = NH * HD;
    const float scale = (float)(1.0 / sqrt((double)HD));
    for (size_t b = 0; b < nb; b++)
        for (size_t t = 0; t < t_n; t++)
            for (size_t h = 0; h < NH; h++) {
                const float *base = qkv + b * t_n * 3 * w, *q = base + t * 3 * w + h * HD;
                float *a = att + ((b * NH + h) * t_n + t) * t_n, mx = -INFINITY, sum = 0.0f;
                for (size_t u = 0; u <= t; u++) {
                    a[u] = dotf(q, base + u * 3 * w + w + h * HD, HD) * scale;
                    if (a[u] > mx) mx = a[u];
                }
                for (size_t u = 0; u <= t; u++) {
                    a[u] = expf(a[u] - mx);
                    sum += a[u];
                }
                float inv = 1.0f / sum;
                for (size_t u = 0; u < t_n; u++) a[u] = u <= t ? a[u] * inv : 0.0f;
                float *o = out + (b * t_n + t) * w + h * HD;
                for (size_t i = 0; i < HD; i++) o[i] = 0.0f;
                for (size_t u = 0; u <= t; u++)
                    for (size_t i = 0; i < HD; i++)
                        o[i] += a[u] * base[u * 3 * w + 2 * w + h * HD + i];
            }
    for (size_t b = 0; b < nb; b++)
        for (size_t t = 0; t < t_n; t++)
            for (size_t h = 0; h < NH; h++) {
                const float *base = qkv + b * t_n * 3 * w, *q = base + t * 3 * w + h * HD;
                float *db = d_qkv + b * t_n * 3 * w, *dq = db + t * 3 * w + h * HD;
                const float *a = att + ((b * NH + h) * t_n + t) * t_n;
                const float *dy = d_out + (b * t_n + t) * w + h * HD;
                float adot = 0.0f;
                for (size_t u = 0; u <= t; u++)
                    adot += a[u] * dotf(dy, base + u * 3 * w + 2 * w + h * HD, HD);
                for (size_t u = 0; u <= t; u++) {
                    const float *k = base + u * 3 * w + w + h * HD, *v = k + w;
                    float *dk = db + u * 3 * w + w + h * HD, *dv = dk + w;
                    float dpre = a[u] * (dotf(dy, v, HD) - adot) * scale;
                    for (size_t i = 0; i < HD; i++) {
                        dv[i] += a[u] * dy[i];
                        dq[i] += dpre * k[i];
                        dk[i] += dpre * q[i];
                    }
                }
            }
}

static void ref_xent(const float *logits, const int *targets, float *mx, float *sum, float *tl,
                     float *loss, float *d) {
    for (size_t i = 0; i < R; i++) {
        const float *l = logits + i * XV;
        mx[i] = -INFINITY;
        for (size_t j = 0; j < XV; j++)
            if (l[j] > mx[i]) mx[i] = l[j];
        double s = 0.0;
        for (size_t j = 0; j < XV; j++) s += exp((double)(l[j] - mx[i]));
        sum[i] = (float)s;
        tl[i] = l[targets[i]];
        double lse = log((double)sum[i]) + (double)mx[i];
        loss[i] = (float)(lse - (double)tl[i]);
        for (size_t j = 0; j < XV; j++) d[i * XV + j] += 0.25f * (float)exp((double)l[j] - lse);
        d[i * XV + targets[i]] -= 0.25f;
    }
}

/* ---- one run: the ops (reference = false) or the old loops, on the same inputs -------------- */

/* The process's threads (/proc/self/task). */
static int task_count(void) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

/* A bf16 copy of n values in [-scale, scale] and, in *wide, the same values as f32. */
static uint16_t *bf16_operand(uint64_t *rng, size_t n, double scale, float **wide) {
    float *f = test_lcg_floats(rng, n, scale);
    uint16_t *h = malloc(n * sizeof *h);
    CHECK(f && h);
    mt_f32_to_bf16_array(f, h, n);
    mt_bf16_to_f32_array(h, f, n);
    *wide = f;
    return h;
}

/* bf16 products (core/cpu/ops_bf16.c; on oneDNN on AVX-512 CPUs unless MT_CPU_BF16_GEMM says),
 * every transpose: 400 x 300 (2 blocks of rows, the last ragged) and a wide 100 x 700 (2 blocks of
 * columns), k 512, and a linear's forward and backward (2 blocks of columns; operands rounded
 * over the pool), against single-threaded sgemm calls on the widened values: f32 sums of exact
 * products in another order, within 3e-5 relative. oneDNN must start no threads of its own: the
 * pool's threads call it with one each. */
static void bf16_products(bool reference, mt_device *dev, record *rec, uint64_t *rng) {
    static const char *names[8] = {"bf16_gemm_nn", "bf16_gemm_nt", "bf16_gemm_tn",
                                   "bf16_gemm_tt", "bf16_gemm_wide_nn", "bf16_gemm_wide_nt",
                                   "bf16_gemm_wide_tn", "bf16_gemm_wide_tt"};
    static const int shapes[2][3] = {{400, 300, 512}, {100, 700, 512}};
    /* B also holds the linear's 4C x C weight */
    enum { MAXA = 400 * 512, MAXB = C4 * C, MAXC = 400 * 300 };
    float *fa, *fb;
    uint16_t *ha = bf16_operand(rng, MAXA, 1.0, &fa), *hb = bf16_operand(rng, MAXB, 1.0, &fb);
    int tasks = reference ? 0 : task_count();
    for (int t = 0; t < 8; t++) {
        bool ta = t % 4 >= 2, tb = t % 2 == 1;
        int m = shapes[t / 4][0], n = shapes[t / 4][1], k = shapes[t / 4][2];
        float *c = test_lcg_floats(rng, MAXC, 1.0);
        if (reference)
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, m, n, k, 0.75f, fa, ta ? m : k, fb,
                        tb ? k : n, 0.5f, c, n);
        else CHECK_OK(mt_op_gemm_ex(dev, ta, tb, m, n, k, 0.75f, ha, hb, MT_BF16, 0.5f, c));
        put(rec, names[t], c, (size_t)m * n, false);
        rec->s[rec->count - 1].tol = 3e-5;
        free(c);
    }
    /* The linear: R rows of C -> 4C, its input and output gradient f32 (rounded by the op). */
    float *x = test_lcg_floats(rng, (size_t)R * C, 2.0), *g = test_lcg_floats(rng, EL, 1.0);
    float *bias = test_lcg_floats(rng, C4, 0.5), *y = test_lcg_floats(rng, EL, 1.0);
    float *dx = test_lcg_floats(rng, (size_t)R * C, 0.5), *dw = test_lcg_floats(rng, (size_t)C4 * C, 0.5);
    float *db = test_lcg_floats(rng, C4, 0.5);
    if (reference) {
        float *xr = malloc((size_t)R * C * sizeof *xr), *gr = malloc((size_t)EL * sizeof *gr);
        CHECK(xr && gr);
        for (size_t i = 0; i < (size_t)R * C; i++) xr[i] = mt_bf16_to_f32(mt_f32_to_bf16(x[i]));
        for (size_t i = 0; i < (size_t)EL; i++) gr[i] = mt_bf16_to_f32(mt_f32_to_bf16(g[i]));
        for (size_t r = 0; r < R; r++) memcpy(y + r * C4, bias, C4 * sizeof(float));
        /* the weight: the first 4C x C values of fb */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, C4, C, 1.0f, xr, C, fb, C, 1.0f,
                    y, C4);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, C, C4, 1.0f, gr, C4, fb, C,
                    1.0f, dx, C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C4, C, R, 1.0f, gr, C4, xr, C, 1.0f,
                    dw, C);
        for (size_t r = 0; r < R; r++)
            for (size_t j = 0; j < C4; j++) db[j] += g[r * C4 + j];
        free(xr), free(gr);
    } else {
        CHECK_OK(mt_op_linear_forward_ex(dev, x, hb, MT_BF16, bias, y, R, C, C4));
        CHECK_OK(mt_op_linear_backward_ex(dev, g, x, hb, MT_BF16, dx, dw, db, R, C, C4));
        int now = task_count();
        CHECK_MSG(now == tasks, "bf16 products left %d threads, %d before", now, tasks);
    }
    put(rec, "bf16_linear_forward", y, EL, false);
    put(rec, "bf16_linear_d_in", dx, (size_t)R * C, false);
    put(rec, "bf16_linear_d_w", dw, (size_t)C4 * C, false);
    put(rec, "bf16_linear_d_bias", db, C4, false);
    for (int i = 4; i > 0; i--) rec->s[rec->count - i].tol = 3e-5;
    free(x), free(g), free(bias), free(ha), free(hb), free(fa), free(fb);
    free(y), free(dx), free(dw), free(db);
}

static void run_all(bool reference, record *rec) {
    uint64_t rng = 0xc0ffee11ULL;
    mt_device *dev = NULL;
    if (!reference) CHECK_OK(mt_device_open_cpu(0, &dev));
    int ids[R], targets[R];
    for (size_t i = 0; i < R; i++) {
        ids[i] = (int)((test_lcg_pm1(&rng) + 1.0) * 18.0); /* 0..35: some outside the slice */
        targets[i] = (int)((test_lcg_pm1(&rng) + 1.0) * 0.5 * (XV - 1));
    }
    float *wte = test_lcg_floats(&rng, (size_t)VOCAB_LOCAL * C, 1.0);
    float *x = test_lcg_floats(&rng, (size_t)R * C, 2.0);
    float *dy = test_lcg_floats(&rng, (size_t)R * C, 1.0);
    float *g = test_lcg_floats(&rng, C, 1.0), *be = test_lcg_floats(&rng, C, 1.0);
    float *big = test_lcg_floats(&rng, EL, 8.0), *big_dy = test_lcg_floats(&rng, EL, 1.0);
    /* attention inputs for AT_LONG positions (>= AB x AT): the long case uses them all */
    float *qkv = test_lcg_floats(&rng, (size_t)AT_LONG * 3 * NH * HD, 1.5);
    float *att_dy = test_lcg_floats(&rng, (size_t)AT_LONG * NH * HD, 1.0);
    float *logits = test_lcg_floats(&rng, (size_t)R * XV, 6.0);
    /* Outputs that accumulate start from nonzero values. */
    float *acc_c = test_lcg_floats(&rng, C, 0.5);
    float *acc_rc = test_lcg_floats(&rng, (size_t)R * C, 0.5);
    float *acc_el = test_lcg_floats(&rng, EL, 0.5);
    float *acc_qkv = test_lcg_floats(&rng, (size_t)AT_LONG * 3 * NH * HD, 0.5);
    float *acc_x = test_lcg_floats(&rng, (size_t)R * XV, 0.5);
    float *out = malloc((size_t)EL * sizeof(float)), *out2 = malloc((size_t)EL * sizeof(float));
    float *d1 = malloc((size_t)EL * sizeof(float)), *d2 = malloc((size_t)EL * sizeof(float));
    float *d3 = malloc((size_t)EL * sizeof(float));
    float mean[R], rstd[R], mx[R], sum[R], tl[R], loss[R];
    CHECK(out && out2 && d1 && d2 && d3);

    /* embeddings: forward (overwrite), backward into a prefilled table */
    memcpy(d1, acc_rc, (size_t)VOCAB_LOCAL * C * sizeof(float));
    if (reference) ref_embedding(ids, wte, out, d1, dy);
    else {
        CHECK_OK(
            mt_op_embedding_forward(dev, ids, R, wte, VOCAB_START, VOCAB_LOCAL, C, out, false));
        CHECK_OK(mt_op_embedding_backward(dev, ids, R, dy, VOCAB_START, VOCAB_LOCAL, C, d1));
    }
    put(rec, "embedding_forward", out, (size_t)R * C, true);
    put(rec, "embedding_backward", d1, (size_t)VOCAB_LOCAL * C, true);

    memcpy(out, x, (size_t)R * C * sizeof(float));
    memcpy(d1, acc_rc, (size_t)T * C * sizeof(float));
    if (reference) ref_position(wte, out, dy, d1);
    else {
        CHECK_OK(mt_op_position_forward(dev, wte, B, T, C, out));
        CHECK_OK(mt_op_position_backward(dev, dy, B, T, C, d1));
    }
    put(rec, "position_forward", out, (size_t)R * C, true);
    put(rec, "position_backward", d1, (size_t)T * C, true);

    memcpy(d1, acc_rc, (size_t)R * C * sizeof(float));
    memcpy(d2, acc_c, C * sizeof(float));
    memcpy(d3, acc_c, C * sizeof(float));
    if (reference) ref_layernorm(x, g, be, out, mean, rstd, dy, d1, d2, d3);
    else {
        CHECK_OK(mt_op_layernorm_forward(dev, x, g, be, R, C, out, mean, rstd));
        CHECK_OK(mt_op_layernorm_backward(dev, dy, x, g, mean, rstd, R, C, d1, d2, d3));
    }
    put(rec, "layernorm_forward", out, (size_t)R * C, true);
    put(rec, "layernorm_mean", mean, R, true);
    put(rec, "layernorm_rstd", rstd, R, true);
    put(rec, "layernorm_d_in", d1, (size_t)R * C, true);
    put(rec, "layernorm_d_gamma", d2, C, true);
    put(rec, "layernorm_d_beta", d3, C, true);

    memcpy(d1, acc_el, (size_t)EL * sizeof(float));
    if (reference) ref_gelu(big, out, big_dy, d1);
    else {
        CHECK_OK(mt_op_gelu_forward(dev, big, out, EL));
        CHECK_OK(mt_op_gelu_backward(dev, big, big_dy, d1, EL));
    }
    put(rec, "gelu_forward", out, EL, false);
    put(rec, "gelu_backward", d1, EL, false);

    if (reference)
        for (size_t i = 0; i < EL; i++) out[i] = big[i] + acc_el[i];
    else CHECK_OK(mt_op_add(dev, big, acc_el, out, EL));
    put(rec, "add", out, EL, true);

    memcpy(out, big, (size_t)EL * sizeof(float));
    if (reference)
        for (size_t i = 0; i < EL; i++) out[i] *= 0.37f;
    else CHECK_OK(mt_op_scale(dev, out, 0.37f, EL));
    put(rec, "scale", out, EL, true);

    size_t nq = (size_t)AB * AT * 3 * NH * HD, no = (size_t)AB * AT * NH * HD;
    size_t na = (size_t)AB * NH * AT * AT;
    memcpy(d1, acc_qkv, nq * sizeof(float));
    if (reference) ref_attention(AB, AT, qkv, out, out2, att_dy, d1);
    else {
        CHECK_OK(mt_op_attention_forward(dev, qkv, AB, AT, NH, HD, out, out2));
        CHECK_OK(mt_op_attention_backward(dev, att_dy, qkv, out2, AB, AT, NH, HD, d1));
    }
    put(rec, "attention_forward", out, no, false);
    put(rec, "attention_weights", out2, na, false);
    put(rec, "attention_backward", d1, nq, false);

    /* One sequence of AT_LONG positions: the backward's products in blocks of 64 (64, 64, 22). */
    size_t nql = (size_t)AT_LONG * 3 * NH * HD, nol = (size_t)AT_LONG * NH * HD;
    memcpy(d1, acc_qkv, nql * sizeof(float));
    if (reference) ref_attention(1, AT_LONG, qkv, out, out2, att_dy, d1);
    else {
        CHECK_OK(mt_op_attention_forward(dev, qkv, 1, AT_LONG, NH, HD, out, out2));
        CHECK_OK(mt_op_attention_backward(dev, att_dy, qkv, out2, 1, AT_LONG, NH, HD, d1));
    }
    put(rec, "attention_forward_150", out, nol, false);
    put(rec, "attention_backward_150", d1, nql, false);

    memcpy(d1, acc_x, (size_t)R * XV * sizeof(float));
    if (reference) ref_xent(logits, targets, mx, sum, tl, loss, d1);
    else {
        CHECK_OK(mt_op_xent_local_max(dev, logits, R, XV, mx));
        CHECK_OK(mt_op_xent_local_sums(dev, logits, targets, R, 0, XV, mx, sum, tl));
        CHECK_OK(mt_op_xent_loss_backward(dev, logits, targets, R, 0, XV, mx, sum, tl, 0.25f,
                                          loss, d1));
    }
    put(rec, "xent_max", mx, R, true);
    put(rec, "xent_sum_exp", sum, R, false);
    put(rec, "xent_target_logit", tl, R, true);
    put(rec, "xent_loss", loss, R, false);
    put(rec, "xent_d_logits", d1, (size_t)R * XV, false);

    memcpy(d2, acc_c, C * sizeof(float));
    if (reference)
        for (size_t i = 0; i < R; i++)
            for (size_t j = 0; j < C; j++) d2[j] += dy[i * C + j];
    else CHECK_OK(mt_cpu_add_column_sums(dy, R, C, d2));
    put(rec, "column_sums", d2, C, true);

    /* products, every transpose: 200 x 180 (cut into 2 blocks of rows, the last ragged), a wide
     * 120 x 300 (2 blocks of columns) and a 1536 x 1536 grid (2 x 2 blocks), against one
     * single-threaded sgemm call; k 400 spans several of OpenBLAS's k blocks */
    static const char *gemm_names[12] = {"gemm_nn", "gemm_nt", "gemm_tn", "gemm_tt",
                                         "gemm_wide_nn", "gemm_wide_nt", "gemm_wide_tn",
                                         "gemm_wide_tt", "gemm_grid_nn", "gemm_grid_nt",
                                         "gemm_grid_tn", "gemm_grid_tt"};
    static const int gemm_shapes[3][3] = {{200, 180, 400}, {120, 300, 250}, {1536, 1536, 16}};
    enum { GRID = 1536 * 1536 };
    uint64_t grid_rng = 0x6772696475ull; /* the grid's C, the same in every run */
    float *grid_c0 = test_lcg_floats(&grid_rng, GRID, 1.0), *grid_c = malloc(GRID * sizeof(float));
    CHECK(grid_c0 && grid_c);
    for (int t = 0; t < 12; t++) {
        bool ta = t % 4 >= 2, tb = t % 2 == 1;
        int gm = gemm_shapes[t / 4][0], gn = gemm_shapes[t / 4][1], gk = gemm_shapes[t / 4][2];
        float *c = t < 8 ? out : grid_c;
        memcpy(c, t < 8 ? big : grid_c0, (size_t)gm * gn * sizeof(float));
        if (reference) {
            openblas_set_num_threads(1);
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, gm, gn, gk, 0.75f, acc_el, ta ? gm : gk,
                        big_dy, tb ? gk : gn, 0.5f, c, gn);
        } else
            CHECK_OK(mt_op_gemm(dev, ta, tb, gm, gn, gk, 0.75f, acc_el, big_dy, 0.5f, c));
        /* k = 16..400 terms: a sum in another order moves by up to ~k * 6e-8 relative */
        put(rec, gemm_names[t], c, (size_t)gm * gn, false);
        rec->s[rec->count - 1].tol = 3e-5;
    }
    free(grid_c0);
    free(grid_c);

    bf16_products(reference, dev, rec, &rng);

    /* sum of squares: its chunked order written plainly; the double's bits travel as 2 floats */
    double sq = 0.125;
    if (reference) {
        sq = test_chunked_sum_squares(sq, big, EL, MT_CPU_ELEM_GRAIN);
    } else CHECK_OK(mt_cpu_op_sum_squares(big, EL, &sq));
    float sq_bits[2];
    memcpy(sq_bits, &sq, sizeof sq);
    put(rec, "sum_squares", sq_bits, 2, true);

    /* casts: f32 -> bf16 -> f32, and accumulate of both dtypes */
    uint16_t *h = malloc((size_t)EL * sizeof(uint16_t));
    CHECK(h != NULL);
    memcpy(d1, acc_el, (size_t)EL * sizeof(float));
    if (reference) {
        mt_f32_to_bf16_array(big, h, EL);
        mt_bf16_to_f32_array(h, out, EL);
        for (size_t i = 0; i < EL; i++) d1[i] += big[i];
        for (size_t i = 0; i < EL; i++) d1[i] += mt_bf16_to_f32(h[i]);
    } else {
        CHECK_OK(mt_op_cast(dev, big, MT_F32, h, MT_BF16, EL));
        CHECK_OK(mt_op_cast(dev, h, MT_BF16, out, MT_F32, EL));
        CHECK_OK(mt_op_accumulate(dev, d1, big, MT_F32, EL));
        CHECK_OK(mt_op_accumulate(dev, d1, h, MT_BF16, EL));
    }
    put(rec, "cast_round_trip", out, EL, true);
    put(rec, "accumulate", d1, EL, true);

    free(h);
    free(wte), free(x), free(dy), free(g), free(be), free(big), free(big_dy), free(qkv);
    free(att_dy), free(logits), free(acc_c), free(acc_rc), free(acc_el), free(acc_qkv);
    free(acc_x), free(out), free(out2), free(d1), free(d2), free(d3);
    if (dev) mt_device_close(dev);
}

/* ---- processes ------------------------------------------------------------------------------ */

static size_t record_floats(const record *r) {
    size_t n = 0;
    for (int i = 0; i < r->count; i++) n += r->s[i].n;
    return n;
}

/* Runs the ops in a child with MT_NUM_THREADS = threads; returns its outputs, concatenated. */
static float *run_child(int threads, size_t n) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        char v[16];
        snprintf(v, sizeof v, "%d", threads);
        setenv("MT_NUM_THREADS", v, 1);
        /* The bf16 products on oneDNN unless the caller says, also where the CPU would not
         * choose it, if oneDNN has bf16 there at all (AVX-512: emulated without AVX512-BF16). */
        if (mt_cpu_has(MT_CPU_AVX512F)) setenv("MT_CPU_BF16_GEMM", "onednn", 0);
        record rec = {0};
        run_all(false, &rec);
        for (int i = 0; i < rec.count; i++) {
            const char *p = (const char *)rec.s[i].data;
            size_t left = rec.s[i].n * sizeof(float);
            while (left) {
                ssize_t w = write(fds[1], p, left);
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) _exit(3);
                p += w, left -= (size_t)w;
            }
        }
        _exit(check_failed_ ? 4 : 0); /* a failed check in the child fails the test */
    }
    close(fds[1]);
    float *all = malloc(n * sizeof(float));
    CHECK(all != NULL);
    char *p = (char *)all;
    size_t left = n * sizeof(float);
    while (left) {
        ssize_t got = read(fds[0], p, left);
        if (got < 0 && errno == EINTR) continue;
        CHECK_MSG(got > 0, "child with %d threads sent %zu bytes short", threads, left);
        p += got, left -= (size_t)got;
    }
    close(fds[0]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child with %d threads failed",
              threads);
    return all;
}

/* Whether this CPU runs vector width w (0: AVX2, 1: AVX-512). */
static bool width_runs(size_t w) {
#if defined(__x86_64__) || defined(__i386__)
    return w == 0 ? __builtin_cpu_supports("avx2") : __builtin_cpu_supports("avx512f");
#else
    (void)w;
    return false;
#endif
}

/* Every GELU width against the generic one, bit for bit, over ragged lengths and specials. */
static void test_gelu_widths(void) {
    enum { N = 1000 + 13 };
    uint64_t rng = 0x6e1u;
    float *x = test_lcg_floats(&rng, N, 12.0), *dy = test_lcg_floats(&rng, N, 1.0);
    float want[N], got[N], dwant[N], dgot[N];
    x[0] = 0.0f, x[1] = -0.0f, x[2] = 1e-30f, x[3] = INFINITY, x[4] = 1e30f, x[5] = -1e30f;
    x[6] = NAN, x[7] = 0.0624f, x[8] = -0.0626f, x[9] = 44.0f;
    typedef void (*fwd)(const float *, float *, size_t);
    typedef void (*bwd)(const float *, const float *, float *, size_t, bool);
    struct { const char *name; fwd f; bwd b; } widths[] = {
        {"avx2", mt_gelu_forward_avx2, mt_gelu_backward_avx2},
        {"avx512", mt_gelu_forward_avx512, mt_gelu_backward_avx512}};
    float zeros_in[N], dzero[N];
    for (size_t len = N - 13; len <= N; len++) {
        mt_gelu_forward_generic(x, want, len);
        for (size_t i = 0; i < len; i++) dwant[i] = 0.25f, dzero[i] = 0.0f;
        mt_gelu_backward_generic(x, dy, dwant, len, false);
        mt_gelu_backward_generic(x, dy, dzero, len, false);
        CHECK(isnan(want[6]) && want[3] == INFINITY && want[0] == 0.0f);
        /* overwrite: d_in unread (NaN in it stays out), the bits of adding into zeros */
        for (size_t i = 0; i < len; i++) zeros_in[i] = NAN;
        mt_gelu_backward_generic(x, dy, zeros_in, len, true);
        CHECK_MSG(memcmp(zeros_in, dzero, len * sizeof(float)) == 0,
                  "gelu backward overwriting differs from adding into zeros at length %zu", len);
        for (size_t w = 0; w < 2; w++) {
            if (!width_runs(w)) continue;
            widths[w].f(x, got, len);
            for (size_t i = 0; i < len; i++) dgot[i] = 0.25f;
            widths[w].b(x, dy, dgot, len, false);
            CHECK_MSG(memcmp(got, want, len * sizeof(float)) == 0 &&
                          memcmp(dgot, dwant, len * sizeof(float)) == 0,
                      "gelu %s differs from the generic width at length %zu", widths[w].name, len);
            for (size_t i = 0; i < len; i++) dgot[i] = NAN;
            widths[w].b(x, dy, dgot, len, true);
            CHECK_MSG(memcmp(dgot, dzero, len * sizeof(float)) == 0,
                      "gelu %s overwriting differs from adding into zeros at length %zu",
                      widths[w].name, len);
        }
    }
    free(x);
    free(dy);
}

/* Every sum-of-squares width against the generic one, bit for bit, over lengths around the lane
 * count and the chunk, with values whose squares span the doubles' exponents (so that a change
 * of order shows in the last bits). */
static void test_sum_squares_widths(void) {
    enum { N = 3 * MT_SQ_LANES + 7 };
    uint64_t rng = 0x5a5a1u;
    float *x = test_lcg_floats(&rng, MT_CPU_ELEM_GRAIN, 1.0);
    for (size_t i = 0; i < MT_CPU_ELEM_GRAIN; i += 3) x[i] *= 1e18f;
    for (size_t i = 1; i < MT_CPU_ELEM_GRAIN; i += 5) x[i] *= 1e-18f;
    const mt_sum_squares_chunk_fn widths[] = {mt_sum_squares_chunk_avx2,
                                              mt_sum_squares_chunk_avx512};
    const char *names[] = {"avx2", "avx512"};
    for (size_t len = 0; len <= MT_CPU_ELEM_GRAIN; len = len < N ? len + 1 : len * 2 + 1) {
        size_t n = len < MT_CPU_ELEM_GRAIN ? len : MT_CPU_ELEM_GRAIN;
        double want = mt_sum_squares_chunk_generic(x, n);
        CHECK_MSG(want == test_chunked_sum_squares(0.0, x, n, MT_CPU_ELEM_GRAIN),
                  "sum of squares, generic, length %zu: not the order written plainly", n);
        for (size_t w = 0; w < 2; w++) {
            if (!width_runs(w)) continue;
            double got = widths[w](x, n);
            CHECK_MSG(memcmp(&got, &want, sizeof got) == 0,
                      "sum of squares %s, length %zu: %.17g, generic %.17g", names[w], n, got,
                      want);
        }
        if (n == MT_CPU_ELEM_GRAIN) break;
    }
    free(x);
}

/* The cross-entropy's row maximum (vectorised in lanes) against the loop it was, bit for bit,
 * on rows of every length around the lane counts made of specials: NaNs (skipped), +0 and -0
 * (the loop keeps the first zero it meets, whichever lane holds it), infinities, all-NaN and
 * empty rows (-inf), and ordinary values. */
static float ref_row_max(const float *l, size_t v) {
    float mx = -INFINITY;
    for (size_t k = 0; k < v; k++)
        if (l[k] > mx) mx = l[k];
    return mx;
}

static void test_xent_max_specials(void) {
    enum { ROWS = 48, MAXV = 70 };
    static const float specials[] = {NAN, 0.0f, -0.0f, INFINITY, -INFINITY, -1e30f, 1e-40f};
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return;
    float *rows = malloc((size_t)ROWS * MAXV * sizeof *rows), got[ROWS];
    CHECK(rows != NULL);
    uint64_t rng = 0x3a11u;
    size_t bad = 0, zero_rows = 0, rows_done = 0;
    for (size_t v = 0; rows && v <= MAXV; v++) {
        for (size_t i = 0; i < ROWS; i++) {
            float *l = rows + i * v;
            int kind = (int)(i % 6);
            for (size_t k = 0; k < v; k++) {
                double u = test_rand_unit(&rng);
                float x = (float)(4.0 * test_rand_unit(&rng) - 3.0);
                if (kind == 0) x = -(float)u; /* <= 0: zeros below can be the maximum */
                if (kind == 1 || (kind >= 3 && u < 0.3))
                    x = specials[(size_t)(test_rand_unit(&rng) * 7.0) % 7];
                if (kind == 2) x = test_rand_unit(&rng) < 0.5 ? 0.0f : -0.0f;
                if (kind == 5) x = NAN;
                l[k] = x;
            }
            /* Zeros of both signs in different lanes, the later one in a lower lane. */
            if (kind == 0 && v > 17) l[1] = -0.0f, l[16] = 0.0f;
            if (kind == 4 && v > 20) l[3] = 0.0f, l[17] = -0.0f;
        }
        CHECK_OK(mt_op_xent_local_max(dev, rows, ROWS, (int)v, got));
        for (size_t i = 0; i < ROWS; i++) {
            float want = ref_row_max(rows + i * v, v);
            zero_rows += want == 0.0f;
            bad += memcmp(&got[i], &want, sizeof want) != 0;
            if (memcmp(&got[i], &want, sizeof want) != 0 && bad <= 5)
                fprintf(stderr, "xent max, %zu logits, row %zu: %g, the loop gives %g\n", v, i,
                        (double)got[i], (double)want);
            rows_done++;
        }
    }
    CHECK_MSG(bad == 0, "xent max: %zu of %zu rows differ from the loop's bits", bad, rows_done);
    CHECK_MSG(zero_rows > 100, "xent max: only %zu rows with a zero maximum", zero_rows);
    free(rows);
    mt_device_close(dev);
}

/* The vector exp of the softmax and cross-entropy (mt_exp_shift_*): every width against the
 * generic one bit for bit, and the generic one against exp in double over [-87, 0] in ulps of
 * the float result (the bound docs/cpu-kernels.md states). */
static void test_exp_widths(void) {
    enum { N = 200003 };
    float *x = malloc(N * sizeof *x), *want = malloc(N * sizeof *want);
    float *got = malloc(N * sizeof *got);
    CHECK(x && want && got);
    for (size_t i = 0; i < N; i++) x[i] = (float)(-87.0 * (double)i / (N - 1)) + 3.5f;
    x[0] = 3.5f, x[1] = 3.5f - 1e-30f, x[2] = nextafterf(3.5f, 0.0f);
    mt_exp_shift_generic(x, 3.5f, want, N);
    double worst = 0.0;
    for (size_t i = 0; i < N; i++) {
        double exact = exp((double)(x[i] - 3.5f)); /* the kernel's rounded argument */
        if (exact < 0x1p-126) continue; /* below the normals: exp(-87) by design */
        int e2;
        frexp(exact, &e2);
        double ulp = ldexp(1.0, e2 - 24), err = fabs((double)want[i] - exact) / ulp;
        if (err > worst) worst = err;
    }
    printf("exp_shift: worst %.3f ulp against exp in double over [-87, 0]\n", worst);
    CHECK_MSG(worst <= 2.0, "exp_shift is %.3f ulp off exp", worst);
    CHECK(want[0] == 1.0f);
    typedef void (*expf_fn)(const float *, float, float *, size_t);
    struct { const char *name; expf_fn f; } widths[] = {{"avx2", mt_exp_shift_avx2},
                                                        {"avx512", mt_exp_shift_avx512}};
    for (size_t w = 0; w < 2; w++) {
        if (!width_runs(w)) continue;
        for (size_t len = N - 17; len <= N; len += 4) {
            widths[w].f(x, 3.5f, got, len);
            CHECK_MSG(memcmp(got, want, len * sizeof(float)) == 0,
                      "exp_shift %s differs from the generic width at length %zu",
                      widths[w].name, len);
        }
    }
    free(x), free(want), free(got);
}

int main(void) {
    test_gelu_widths();
    test_sum_squares_widths();
    test_exp_widths();
    record ref = {0};
    run_all(true, &ref);
    size_t n = record_floats(&ref);
    static const int counts[] = {1, 2, 3, 7};
    float *runs[4];
    for (int k = 0; k < 4; k++) runs[k] = run_child(counts[k], n);
    size_t at = 0;
    for (int i = 0; i < ref.count; i++) {
        const seg *s = &ref.s[i];
        for (int k = 1; k < 4; k++)
            CHECK_MSG(memcmp(runs[k] + at, runs[0] + at, s->n * sizeof(float)) == 0,
                      "%s: %d threads differ from 1 thread", s->name, counts[k]);
        size_t bad = 0;
        double worst = 0.0;
        for (size_t j = 0; j < s->n; j++) {
            float got = runs[0][at + j], want = s->data[j];
            if (s->exact) {
                if (memcmp(&got, &want, sizeof got) != 0) bad++;
                continue;
            }
            double err = fabs((double)got - (double)want) / (1.0 + fabs((double)want));
            if (err > worst) worst = err;
            if (!(err <= s->tol)) bad++;
        }
        CHECK_MSG(bad == 0, "%s: %zu of %zu values off the single-threaded loop (%s %.0e)",
                  s->name, bad, s->n, s->exact ? "bits" : "relative", s->tol);
        if (!s->exact) printf("%s: worst %.3g relative to the libm formula\n", s->name, worst);
        at += s->n;
        free(s->data);
    }
    for (int k = 0; k < 4; k++) free(runs[k]);
    printf("%d outputs compared on 1, 2, 3 and 7 threads\n", ref.count);
    test_xent_max_specials(); /* last: it makes this process's pool, which a fork would not copy */
    return check_report("test_cpu_ops_threads");
}
