/* Causal self-attention on the CPU device (include/meshtrain/ops.h, "GPT ops"), split over the
 * rank's pool by (batch, head) pair: a pair reads its own columns of qkv and writes its own
 * columns of out, att and d_qkv, so pairs never share an accumulator and each pair's work runs
 * in one thread (the same bits with any pool).
 *
 * Both directions are products per pair on OpenBLAS at 1 thread, which the pool's threads may
 * call (core/cpu/ops_gemm.c). Forward: scores Q K^T, the causal softmax, then att V; 2.7-2.9x
 * faster than the dot loops at seq 64 and 128 (docs/benchmarks.md, round 2). Backward: four
 * products (dV, the softmax's input gradient dY V^T, dQ, dK) around a vectorised softmax
 * backward, in blocks that stop at the diagonal; 2.8x (seq 64) to 5.4x (seq 1024) less CPU time
 * than the loops (docs/benchmarks.md, round 3; docs/cpu-kernels.md). Neither gives the old
 * loops' bits (summation order); tests/core/test_cpu_ops_threads.c holds them within 3e-6 of
 * the loops and bit for bit across thread counts. The softmax's exponentials run in the vector
 * exp of core/cpu/gelu_vec.h (same bits at every width; within 2 ulp of exp). */
#include "core/cpu/gelu_kernels.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/parallel.h"
#include "core/error.h"

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct attn_job {
    const float *qkv, *att_in, *d_out;
    float *out, *att, *d_qkv;
    size_t t_n, nh, hd, width;
    float scale;
    float beta; /* backward: 1 adds into d_qkv, 0 overwrites it (each element has one product) */
    mt_exp_shift_fn exp_shift;
    float *scratch; /* backward: one T x T block per chunk of pairs (attn_backward_chunks) */
} attn_job;

/* The forward as two products per pair, on OpenBLAS at 1 thread inside the pool's worker:
 * att = scale * Q K^T (all T x T scores, the causal half then masked by the softmax), then
 * out = att V (the masked scores are exact zeros). */
static void attn_forward_pair(const attn_job *j, size_t pair) {
    size_t b = pair / j->nh, h = pair % j->nh;
    size_t t_n = j->t_n, hd = j->hd, width = j->width;
    const float *base = j->qkv + b * t_n * 3 * width;
    float *att = j->att + pair * t_n * t_n;
    int T = (int)t_n, HD = (int)hd, ld = (int)(3 * width);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HD, j->scale, base + h * hd, ld,
                base + width + h * hd, ld, 0.0f, att, T);
    for (size_t t = 0; t < t_n; t++) {
        float *a = att + t * t_n, mx = -INFINITY;
        for (size_t u = 0; u <= t; u++)
            if (a[u] > mx) mx = a[u];
        j->exp_shift(a, mx, a, t + 1); /* vectorised; its error: core/cpu/gelu_vec.h */
        float sum = 0.0f;
        for (size_t u = 0; u <= t; u++) sum += a[u];
        float inv = 1.0f / sum; /* sum >= 1: the maximum contributes exp(0) */
        for (size_t u = 0; u < t_n; u++) a[u] = u <= t ? a[u] * inv : 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HD, T, 1.0f, att, T,
                base + 2 * width + h * hd, ld, 0.0f, j->out + b * t_n * width + h * hd,
                (int)width);
}

static void attn_forward_pairs(void *ctx, size_t chunk, size_t begin, size_t end) {
    for (size_t p = begin; p < end; p++) attn_forward_pair(ctx, p);
}

/* Lanes of the softmax backward's row sum: explicit, so that the sum vectorises (GCC keeps a
 * single float accumulator in order) and its order is fixed by the row's length alone. */
#define ATTN_LANES 8

/* sum_u a[u] * d[u] over u < n, in ATTN_LANES interleaved partial sums combined in a fixed
 * order. */
static float lane_dot(const float *restrict a, const float *restrict d, size_t n) {
    float lane[ATTN_LANES] = {0};
    size_t u = 0;
    for (; u + ATTN_LANES <= n; u += ATTN_LANES)
        for (size_t l = 0; l < ATTN_LANES; l++) lane[l] += a[u + l] * d[u + l];
    for (size_t l = 0; u + l < n; l++) lane[l] += a[u + l] * d[u + l];
    for (size_t w = ATTN_LANES / 2; w > 0; w /= 2)
        for (size_t l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

/* Softmax backward of query row t, in place: d (datt = dy_t . v_u on entry) becomes
 * a_u (datt_u - sum_u' a_u' datt_u') for u <= t and exactly 0 beyond, without reading d or a
 * there: the masked entries of datt (dy_t . v_u for later u) may be Inf or NaN and must not reach
 * the products (0 x NaN is NaN). The scale is left to the products' alpha. */
static void softmax_backward_row(const float *restrict a, float *restrict d, size_t t,
                                 size_t t_n) {
    float adot = lane_dot(a, d, t + 1);
    for (size_t u = 0; u <= t; u++) d[u] = a[u] * (d[u] - adot);
    memset(d + t + 1, 0, (t_n - t - 1) * sizeof(float));
}

/* Rows (query positions) per block of the backward's products: each block's products stop at
 * its last row's column, so a long sequence skips most of the masked half (at seq 1024, 16
 * blocks do 53% of the full square's multiply-adds). Fixed, never from the thread count; 64
 * rows keep OpenBLAS's kernels near their peak. */
#define ATTN_BLOCK ((size_t)64)

/* The backward as products per pair, on OpenBLAS at 1 thread inside the pool's worker, on one
 * T x T scratch block s: s = the causal part of att (zeros past the diagonal, whatever the
 * caller's att holds there); dV += s^T dY; s = dY V^T; the softmax backward turns s into the
 * scores' gradient (zeros past the diagonal); dQ += scale s K; dK += scale s^T Q. Each product
 * runs per block of ATTN_BLOCK rows (dY V^T, dQ) or columns (dV, dK) of s, over the part of s
 * that block's causal entries lie in: rows [i0, i1) need columns [0, i1), columns [j0, j1) rows
 * [j0, T). Each element of the pair's dQ, dK and dV is written by exactly one of these products,
 * so overwriting d_qkv is beta 0 in them (OpenBLAS then does not read C), no pass of zeros. */
static void attn_backward_pair(const attn_job *j, size_t pair, float *s) {
    size_t b = pair / j->nh, h = pair % j->nh;
    size_t t_n = j->t_n, hd = j->hd, width = j->width;
    const float *q = j->qkv + b * t_n * 3 * width + h * hd, *k = q + width, *v = k + width;
    float *dq = j->d_qkv + b * t_n * 3 * width + h * hd, *dk = dq + width, *dv = dk + width;
    const float *att = j->att_in + pair * t_n * t_n;
    const float *dy = j->d_out + b * t_n * width + h * hd;
    size_t ld = 3 * width;
    int T = (int)t_n, HD = (int)hd;
    for (size_t t = 0; t < t_n; t++) {
        memcpy(s + t * t_n, att + t * t_n, (t + 1) * sizeof(float));
        memset(s + t * t_n + t + 1, 0, (t_n - t - 1) * sizeof(float));
    }
    for (size_t j0 = 0; j0 < t_n; j0 += ATTN_BLOCK) {
        int n = (int)(t_n - j0 < ATTN_BLOCK ? t_n - j0 : ATTN_BLOCK), rows = (int)(t_n - j0);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, HD, rows, 1.0f,
                    s + j0 * t_n + j0, T, dy + j0 * width, (int)width, j->beta, dv + j0 * ld,
                    (int)ld);
    }
    /* beta 0: OpenBLAS stores C without reading it; the columns past i1 keep att's copy until
     * the softmax backward zeroes them. */
    for (size_t i0 = 0; i0 < t_n; i0 += ATTN_BLOCK) {
        size_t i1 = t_n - i0 < ATTN_BLOCK ? t_n : i0 + ATTN_BLOCK;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(i1 - i0), (int)i1, HD, 1.0f,
                    dy + i0 * width, (int)width, v, (int)ld, 0.0f, s + i0 * t_n, T);
    }
    for (size_t t = 0; t < t_n; t++) softmax_backward_row(att + t * t_n, s + t * t_n, t, t_n);
    for (size_t i0 = 0; i0 < t_n; i0 += ATTN_BLOCK) {
        size_t i1 = t_n - i0 < ATTN_BLOCK ? t_n : i0 + ATTN_BLOCK;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(i1 - i0), HD, (int)i1,
                    j->scale, s + i0 * t_n, T, k, (int)ld, j->beta, dq + i0 * ld, (int)ld);
    }
    for (size_t j0 = 0; j0 < t_n; j0 += ATTN_BLOCK) {
        int n = (int)(t_n - j0 < ATTN_BLOCK ? t_n - j0 : ATTN_BLOCK), rows = (int)(t_n - j0);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, HD, rows, j->scale,
                    s + j0 * t_n + j0, T, q + j0 * ld, (int)ld, j->beta, dk + j0 * ld, (int)ld);
    }
}

/* The backward's pairs go in at most this many chunks, each with its own T x T scratch block,
 * all allocated before any pair runs: a failed allocation then leaves d_qkv untouched, and a
 * call makes one allocation instead of one per pair. Each pair's result does not depend on its
 * chunk, so neither the chunking nor the thread count changes a bit. */
#define ATTN_BACKWARD_MAX_CHUNKS ((size_t)8)

static void attn_backward_chunks(void *ctx, size_t chunk, size_t begin, size_t end) {
    const attn_job *j = ctx;
    float *s = j->scratch + chunk * j->t_n * j->t_n;
    for (size_t p = begin; p < end; p++) attn_backward_pair(j, p, s);
}

static bool attn_empty(const attn_job *job, size_t pairs) {
    return job->t_n == 0 || job->hd == 0 || pairs == 0;
}

mt_status mt_cpu_op_attention_forward(const float *qkv, int batch, int seq, int heads,
                                      int head_dim, float *out, float *att) {
    size_t nh = (size_t)heads, hd = (size_t)head_dim;
    attn_job job = {.qkv = qkv, .out = out, .att = att, .t_n = (size_t)seq, .nh = nh, .hd = hd,
                    .width = nh * hd, .scale = (float)(1.0 / sqrt((double)head_dim)),
                    .exp_shift = mt_exp_shift_pick()};
    size_t pairs = (size_t)batch * nh;
    if (attn_empty(&job, pairs)) return MT_OK;
    return mt_cpu_parallel("attention_forward", pairs, 1, attn_forward_pairs, &job);
}

mt_status mt_cpu_op_attention_backward(const float *d_out, const float *qkv, const float *att,
                                       int batch, int seq, int heads, int head_dim, float *d_qkv,
                                       bool overwrite) {
    size_t nh = (size_t)heads, hd = (size_t)head_dim;
    attn_job job = {.qkv = qkv, .att_in = att, .d_out = d_out, .d_qkv = d_qkv,
                    .t_n = (size_t)seq, .nh = nh, .hd = hd, .width = nh * hd,
                    .scale = (float)(1.0 / sqrt((double)head_dim)),
                    .beta = overwrite ? 0.0f : 1.0f};
    size_t pairs = (size_t)batch * nh;
    if (attn_empty(&job, pairs)) return MT_OK;
    size_t grain = (pairs + ATTN_BACKWARD_MAX_CHUNKS - 1) / ATTN_BACKWARD_MAX_CHUNKS;
    size_t chunks = mt_parallel_chunks(pairs, grain);
    job.scratch = malloc(chunks * job.t_n * job.t_n * sizeof(float));
    if (!job.scratch)
        return mt_error(MT_ERR_OUT_OF_MEMORY,
                        "attention_backward on the CPU: out of memory for %zu score-gradient "
                        "blocks of %zu x %zu floats; d_qkv is unchanged",
                        chunks, job.t_n, job.t_n);
    mt_status st = mt_cpu_parallel("attention_backward", pairs, grain, attn_backward_chunks, &job);
    free(job.scratch);
    return st;
}
