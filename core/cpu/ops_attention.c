/* Causal self-attention on the CPU device (include/meshtrain/ops.h, "GPT ops"), split over the
 * rank's pool by (batch, head) pair: a pair reads its own columns of qkv and writes its own
 * columns of out, att and d_qkv, so pairs never share an accumulator and each pair's work runs
 * in one thread (the same bits with any pool).
 *
 * Forward: two sgemm calls per pair (scores Q K^T, then att V) on OpenBLAS at 1 thread, which
 * the pool's threads may call (core/cpu/ops_gemm.c), with the causal softmax between them; 2.7-
 * 2.9x faster than the dot loops at seq 64 and 128 (docs/benchmarks.md), at the cost of the
 * loops' bits (within 1.6e-7 of them, tests/core/test_cpu_ops_threads.c). Backward: the dot
 * products dy_t . v_u are the cost; each pair copies its V transposed into a scratch block
 * (head_dim x seq), so that the products for all u <= t run as head_dim vectorisable updates
 * s[u] += dy[i] * vT[i][u]: every s[u] still adds the terms for i = 0, 1, ... in turn from 0,
 * the dot loop's sequence of roundings. The softmax's exponentials run in the vector exp of
 * core/cpu/gelu_vec.h (same bits at every width; within 2 ulp of exp). */
#include "core/cpu/gelu_kernels.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/parallel.h"
#include "core/error.h"

#include <cblas.h>
#include <stdbool.h>
#include <math.h>
#include <stdlib.h>

typedef struct attn_job {
    const float *qkv, *att_in, *d_out;
    float *out, *att, *d_qkv;
    float *scratch; /* per pair: head_dim * seq (transposed K or V), then seq (one row) */
    size_t t_n, nh, hd, width;
    float scale;
    mt_exp_shift_fn exp_shift;
} attn_job;

/* y[i] += a * x[i]; restrict lets the compiler vectorise without overlap checks. */
static inline void axpy(float *restrict y, float a, const float *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* The pair's rows of K (part 1) or V (part 2) transposed: dst[i * t_n + u] = row u, column i. */
static void transpose_part(const attn_job *j, const float *base, size_t part, size_t h,
                           float *restrict dst) {
    size_t t_n = j->t_n, hd = j->hd, stride = 3 * j->width;
    for (size_t u = 0; u < t_n; u++) {
        const float *src = base + u * stride + part * j->width + h * hd;
        for (size_t i = 0; i < hd; i++) dst[i * t_n + u] = src[i];
    }
}

/* s[u] = x . column u of xT for u < count (xT: hd x t_n), in the dot loop's order. */
static void dots(const float *x, const float *xT, size_t hd, size_t t_n, size_t count,
                 float *restrict s) {
    for (size_t u = 0; u < count; u++) s[u] = 0.0f;
    for (size_t i = 0; i < hd; i++) axpy(s, x[i], xT + i * t_n, count);
}

static float *pair_scratch(const attn_job *j, size_t pair) {
    return j->scratch + pair * (j->hd + 1) * j->t_n;
}

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

static void attn_backward_pair(const attn_job *j, size_t pair) {
    size_t b = pair / j->nh, h = pair % j->nh;
    size_t t_n = j->t_n, hd = j->hd, width = j->width;
    const float *base = j->qkv + b * t_n * 3 * width;
    float *dbase = j->d_qkv + b * t_n * 3 * width;
    float *vT = pair_scratch(j, pair), *datt = vT + hd * t_n;
    transpose_part(j, base, 2, h, vT);
    for (size_t t = 0; t < t_n; t++) {
        const float *q = base + t * 3 * width + h * hd;
        float *dq = dbase + t * 3 * width + h * hd;
        const float *a = j->att_in + (pair * t_n + t) * t_n;
        const float *dy = j->d_out + (b * t_n + t) * width + h * hd;
        /* Softmax backward needs sum_u a_u * datt_u before any dpreatt. */
        dots(dy, vT, hd, t_n, t + 1, datt);
        float adot = 0.0f;
        for (size_t u = 0; u <= t; u++) adot += a[u] * datt[u];
        for (size_t u = 0; u <= t; u++) {
            const float *k = base + u * 3 * width + width + h * hd;
            float *dk = dbase + u * 3 * width + width + h * hd;
            float *dv = dk + width;
            float dpre = a[u] * (datt[u] - adot) * j->scale;
            axpy(dv, a[u], dy, hd);
            axpy(dq, dpre, k, hd);
            axpy(dk, dpre, q, hd);
        }
    }
}

static void attn_backward_pairs(void *ctx, size_t chunk, size_t begin, size_t end) {
    for (size_t p = begin; p < end; p++) attn_backward_pair(ctx, p);
}

/* Runs fn over the pairs, with a scratch block each when scratch is set (the backward). */
static mt_status attn_run(const char *op, attn_job *job, size_t pairs, mt_parallel_fn fn,
                          bool scratch) {
    if (job->t_n == 0 || job->hd == 0 || pairs == 0) return MT_OK;
    size_t floats = scratch ? pairs * (job->hd + 1) * job->t_n : 0;
    job->scratch = scratch ? malloc(floats * sizeof(float)) : NULL;
    if (scratch && !job->scratch)
        return mt_error(MT_ERR_OUT_OF_MEMORY,
                        "%s on the CPU: out of memory for %zu floats of transposed keys/values",
                        op, floats);
    mt_status st = mt_cpu_parallel(op, pairs, 1, fn, job);
    free(job->scratch);
    return st;
}

mt_status mt_cpu_op_attention_forward(const float *qkv, int batch, int seq, int heads,
                                      int head_dim, float *out, float *att) {
    size_t nh = (size_t)heads, hd = (size_t)head_dim;
    attn_job job = {.qkv = qkv, .out = out, .att = att, .t_n = (size_t)seq, .nh = nh, .hd = hd,
                    .width = nh * hd, .scale = (float)(1.0 / sqrt((double)head_dim)),
                    .exp_shift = mt_exp_shift_pick()};
    return attn_run("attention_forward", &job, (size_t)batch * nh, attn_forward_pairs,
                    false);
}

mt_status mt_cpu_op_attention_backward(const float *d_out, const float *qkv, const float *att,
                                       int batch, int seq, int heads, int head_dim, float *d_qkv) {
    size_t nh = (size_t)heads, hd = (size_t)head_dim;
    attn_job job = {.qkv = qkv, .att_in = att, .d_out = d_out, .d_qkv = d_qkv,
                    .t_n = (size_t)seq, .nh = nh, .hd = hd, .width = nh * hd,
                    .scale = (float)(1.0 / sqrt((double)head_dim))};
    return attn_run("attention_backward", &job, (size_t)batch * nh, attn_backward_pairs,
                    true);
}
