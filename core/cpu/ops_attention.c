/* Causal self-attention on the CPU device (include/meshtrain/ops.h, "GPT ops"), split over the
 * rank's pool by (batch, head) pair: a pair reads its own columns of qkv and writes its own
 * columns of out, att and d_qkv, so pairs never share an accumulator and each pair's work runs
 * in one thread in the order of the single-threaded loop (the same bits with any pool). */
#include "core/cpu/ops_cpu.h"
#include "core/cpu/parallel.h"

#include <math.h>

typedef struct attn_job {
    const float *qkv, *att_in, *d_out;
    float *out, *att, *d_qkv;
    size_t t_n, nh, hd, width;
    float scale;
} attn_job;

static float dot(const float *a, const float *b, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void attn_forward_pair(const attn_job *j, size_t b, size_t h) {
    size_t t_n = j->t_n, hd = j->hd, width = j->width;
    const float *base = j->qkv + b * t_n * 3 * width;
    for (size_t t = 0; t < t_n; t++) {
        const float *q = base + t * 3 * width + h * hd;
        float *a = j->att + ((b * j->nh + h) * t_n + t) * t_n;
        float mx = -INFINITY;
        for (size_t t2 = 0; t2 <= t; t2++) {
            const float *k = base + t2 * 3 * width + width + h * hd;
            a[t2] = dot(q, k, hd) * j->scale;
            if (a[t2] > mx) mx = a[t2];
        }
        float sum = 0.0f;
        for (size_t t2 = 0; t2 <= t; t2++) {
            a[t2] = expf(a[t2] - mx);
            sum += a[t2];
        }
        float inv = 1.0f / sum; /* sum >= 1: the maximum contributes exp(0) */
        for (size_t t2 = 0; t2 < t_n; t2++) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
        float *o = j->out + (b * t_n + t) * width + h * hd;
        for (size_t i = 0; i < hd; i++) o[i] = 0.0f;
        for (size_t t2 = 0; t2 <= t; t2++) {
            const float *v = base + t2 * 3 * width + 2 * width + h * hd;
            for (size_t i = 0; i < hd; i++) o[i] += a[t2] * v[i];
        }
    }
}

static void attn_forward_pairs(void *ctx, size_t chunk, size_t begin, size_t end) {
    const attn_job *j = ctx;
    for (size_t p = begin; p < end; p++) attn_forward_pair(j, p / j->nh, p % j->nh);
}

mt_status mt_cpu_op_attention_forward(const float *qkv, int batch, int seq, int heads,
                                      int head_dim, float *out, float *att) {
    size_t nb = (size_t)batch, nh = (size_t)heads, hd = (size_t)head_dim;
    attn_job job = {.qkv = qkv, .out = out, .att = att, .t_n = (size_t)seq, .nh = nh, .hd = hd,
                    .width = nh * hd, .scale = (float)(1.0 / sqrt((double)head_dim))};
    if (job.t_n == 0 || hd == 0) return MT_OK;
    return mt_cpu_parallel("attention_forward", nb * nh, 1, attn_forward_pairs, &job);
}

static void attn_backward_pair(const attn_job *j, size_t b, size_t h) {
    size_t t_n = j->t_n, hd = j->hd, width = j->width;
    const float *base = j->qkv + b * t_n * 3 * width;
    float *dbase = j->d_qkv + b * t_n * 3 * width;
    for (size_t t = 0; t < t_n; t++) {
        const float *q = base + t * 3 * width + h * hd;
        float *dq = dbase + t * 3 * width + h * hd;
        const float *a = j->att_in + ((b * j->nh + h) * t_n + t) * t_n;
        const float *dy = j->d_out + (b * t_n + t) * width + h * hd;
        /* Softmax backward needs sum_j a_j * datt_j before any dpreatt; datt_j (dy . v_j) is
         * recomputed in the second pass rather than kept in a scratch row. */
        float adot = 0.0f;
        for (size_t t2 = 0; t2 <= t; t2++) {
            const float *v = base + t2 * 3 * width + 2 * width + h * hd;
            adot += a[t2] * dot(dy, v, hd);
        }
        for (size_t t2 = 0; t2 <= t; t2++) {
            const float *k = base + t2 * 3 * width + width + h * hd;
            const float *v = base + t2 * 3 * width + 2 * width + h * hd;
            float *dk = dbase + t2 * 3 * width + width + h * hd;
            float *dv = dbase + t2 * 3 * width + 2 * width + h * hd;
            float datt = dot(dy, v, hd);
            float dpre = a[t2] * (datt - adot) * j->scale;
            for (size_t i = 0; i < hd; i++) {
                dv[i] += a[t2] * dy[i];
                dq[i] += dpre * k[i];
                dk[i] += dpre * q[i];
            }
        }
    }
}

static void attn_backward_pairs(void *ctx, size_t chunk, size_t begin, size_t end) {
    const attn_job *j = ctx;
    for (size_t p = begin; p < end; p++) attn_backward_pair(j, p / j->nh, p % j->nh);
}

mt_status mt_cpu_op_attention_backward(const float *d_out, const float *qkv, const float *att,
                                       int batch, int seq, int heads, int head_dim, float *d_qkv) {
    size_t nb = (size_t)batch, nh = (size_t)heads, hd = (size_t)head_dim;
    attn_job job = {.qkv = qkv, .att_in = att, .d_out = d_out, .d_qkv = d_qkv,
                    .t_n = (size_t)seq, .nh = nh, .hd = hd, .width = nh * hd,
                    .scale = (float)(1.0 / sqrt((double)head_dim))};
    if (job.t_n == 0 || hd == 0) return MT_OK;
    return mt_cpu_parallel("attention_backward", nb * nh, 1, attn_backward_pairs, &job);
}
