/* GPT ops (include/meshtrain/ops.h, "GPT ops") on the CPU device: embeddings, LayerNorm, GELU,
 * causal attention and the vocabulary-parallel cross-entropy, as plain loops in the formulas of
 * llm.c. Reductions that feed a loss or a normalisation accumulate in double: the results are
 * compared across tp sizes, where float rounding that depends on the slice split would show. */
#include "core/cpu/ops_cpu.h"
#include "core/error.h"

#include <math.h>
#include <stdint.h>

/* Row of the slice that id selects, or -1 when id lies outside [start, start + local). */
static long slice_row(int id, int vocab_start, int vocab_local) {
    long r = (long)id - (long)vocab_start;
    return (r >= 0 && r < vocab_local) ? r : -1;
}

/* ---- embeddings ------------------------------------------------------------------------------ */

mt_status mt_cpu_op_embedding_forward(const int *ids, size_t n, const float *wte, int vocab_start,
                                      int vocab_local, int channels, float *out, bool accumulate) {
    size_t c = (size_t)channels;
    for (size_t i = 0; i < n; i++) {
        float *o = out + i * c;
        long r = slice_row(ids[i], vocab_start, vocab_local);
        if (r < 0) {
            if (!accumulate)
                for (size_t j = 0; j < c; j++) o[j] = 0.0f;
            continue;
        }
        const float *w = wte + (size_t)r * c;
        if (accumulate)
            for (size_t j = 0; j < c; j++) o[j] += w[j];
        else
            for (size_t j = 0; j < c; j++) o[j] = w[j];
    }
    return MT_OK;
}

mt_status mt_cpu_op_embedding_backward(const int *ids, size_t n, const float *d_out,
                                       int vocab_start, int vocab_local, int channels,
                                       float *d_wte) {
    size_t c = (size_t)channels;
    for (size_t i = 0; i < n; i++) {
        long r = slice_row(ids[i], vocab_start, vocab_local);
        if (r < 0) continue;
        float *g = d_wte + (size_t)r * c;
        const float *d = d_out + i * c;
        for (size_t j = 0; j < c; j++) g[j] += d[j];
    }
    return MT_OK;
}

mt_status mt_cpu_op_position_forward(const float *wpe, int batch, int seq, int channels,
                                     float *out) {
    size_t t_n = (size_t)seq, c = (size_t)channels;
    for (size_t b = 0; b < (size_t)batch; b++) {
        float *o = out + b * t_n * c;
        for (size_t i = 0; i < t_n * c; i++) o[i] += wpe[i];
    }
    return MT_OK;
}

mt_status mt_cpu_op_position_backward(const float *d_out, int batch, int seq, int channels,
                                      float *d_wpe) {
    size_t t_n = (size_t)seq, c = (size_t)channels;
    for (size_t b = 0; b < (size_t)batch; b++) {
        const float *d = d_out + b * t_n * c;
        for (size_t i = 0; i < t_n * c; i++) d_wpe[i] += d[i];
    }
    return MT_OK;
}

/* ---- LayerNorm ------------------------------------------------------------------------------- */

static const double layernorm_eps = 1e-5;

mt_status mt_cpu_op_layernorm_forward(const float *in, const float *gamma, const float *beta,
                                      size_t n, int channels, float *out, float *mean,
                                      float *rstd) {
    size_t c = channels > 0 ? (size_t)channels : 0;
    for (size_t i = 0; i < n; i++) {
        const float *x = in + i * c;
        double m = 0.0;
        for (size_t j = 0; j < c; j++) m += x[j];
        m /= (double)c;
        /* Two passes: the variance from the centred values does not cancel catastrophically. */
        double v = 0.0;
        for (size_t j = 0; j < c; j++) {
            double d = x[j] - m;
            v += d * d;
        }
        v /= (double)c;
        float mf = (float)m, rs = (float)(1.0 / sqrt(v + layernorm_eps));
        float *o = out + i * c;
        for (size_t j = 0; j < c; j++) o[j] = (x[j] - mf) * rs * gamma[j] + beta[j];
        mean[i] = mf;
        rstd[i] = rs;
    }
    return MT_OK;
}

mt_status mt_cpu_op_layernorm_backward(const float *d_out, const float *in, const float *gamma,
                                       const float *mean, const float *rstd, size_t n,
                                       int channels, float *d_in, float *d_gamma, float *d_beta) {
    size_t c = channels > 0 ? (size_t)channels : 0;
    for (size_t i = 0; i < n; i++) {
        const float *x = in + i * c, *dy = d_out + i * c;
        float m = mean[i], rs = rstd[i];
        /* d_in = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dy * gamma. */
        double dn_mean = 0.0, dn_norm_mean = 0.0;
        for (size_t j = 0; j < c; j++) {
            double norm = (double)((x[j] - m) * rs);
            double dn = (double)gamma[j] * dy[j];
            dn_mean += dn;
            dn_norm_mean += dn * norm;
        }
        dn_mean /= (double)c;
        dn_norm_mean /= (double)c;
        float *dx = d_in + i * c;
        for (size_t j = 0; j < c; j++) {
            float norm = (x[j] - m) * rs;
            float dn = gamma[j] * dy[j];
            d_beta[j] += dy[j];
            d_gamma[j] += norm * dy[j];
            dx[j] += (float)(((double)dn - dn_mean - (double)norm * dn_norm_mean) * rs);
        }
    }
    return MT_OK;
}

/* ---- GELU and residual ----------------------------------------------------------------------- */

/* sqrt(2 / pi) */
static const float gelu_k = 0.7978845608028654f;
static const float gelu_c = 0.044715f;

mt_status mt_cpu_op_gelu_forward(const float *in, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = in[i];
        out[i] = 0.5f * x * (1.0f + tanhf(gelu_k * (x + gelu_c * x * x * x)));
    }
    return MT_OK;
}

mt_status mt_cpu_op_gelu_backward(const float *in, const float *d_out, float *d_in, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = in[i];
        float th = tanhf(gelu_k * (x + gelu_c * x * x * x));
        /* sech^2 as 1 - tanh^2: cosh overflows for large |x|, tanh saturates cleanly. */
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) +
                     0.5f * x * sech2 * gelu_k * (1.0f + 3.0f * gelu_c * x * x);
        d_in[i] += grad * d_out[i];
    }
    return MT_OK;
}

mt_status mt_cpu_op_add(const float *a, const float *b, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    return MT_OK;
}

/* ---- causal self-attention ------------------------------------------------------------------- */

static float dot(const float *a, const float *b, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

mt_status mt_cpu_op_attention_forward(const float *qkv, int batch, int seq, int heads,
                                      int head_dim, float *out, float *att) {
    size_t nb = (size_t)batch, t_n = (size_t)seq, nh = (size_t)heads, hd = (size_t)head_dim;
    size_t width = nh * hd, rows = nb * t_n;
    if (rows == 0 || width == 0) return MT_OK;
    float scale = (float)(1.0 / sqrt((double)head_dim));
    for (size_t b = 0; b < nb; b++) {
        const float *base = qkv + b * t_n * 3 * width;
        for (size_t t = 0; t < t_n; t++) {
            for (size_t h = 0; h < nh; h++) {
                const float *q = base + t * 3 * width + h * hd;
                float *a = att + ((b * nh + h) * t_n + t) * t_n;
                float mx = -INFINITY;
                for (size_t t2 = 0; t2 <= t; t2++) {
                    const float *k = base + t2 * 3 * width + width + h * hd;
                    a[t2] = dot(q, k, hd) * scale;
                    if (a[t2] > mx) mx = a[t2];
                }
                float sum = 0.0f;
                for (size_t t2 = 0; t2 <= t; t2++) {
                    a[t2] = expf(a[t2] - mx);
                    sum += a[t2];
                }
                float inv = 1.0f / sum; /* sum >= 1: the maximum contributes exp(0) */
                for (size_t t2 = 0; t2 < t_n; t2++) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
                float *o = out + (b * t_n + t) * width + h * hd;
                for (size_t i = 0; i < hd; i++) o[i] = 0.0f;
                for (size_t t2 = 0; t2 <= t; t2++) {
                    const float *v = base + t2 * 3 * width + 2 * width + h * hd;
                    for (size_t i = 0; i < hd; i++) o[i] += a[t2] * v[i];
                }
            }
        }
    }
    return MT_OK;
}

mt_status mt_cpu_op_attention_backward(const float *d_out, const float *qkv, const float *att,
                                       int batch, int seq, int heads, int head_dim, float *d_qkv) {
    size_t nb = (size_t)batch, t_n = (size_t)seq, nh = (size_t)heads, hd = (size_t)head_dim;
    size_t width = nh * hd, rows = nb * t_n;
    if (rows == 0 || width == 0) return MT_OK;
    float scale = (float)(1.0 / sqrt((double)head_dim));
    for (size_t b = 0; b < nb; b++) {
        const float *base = qkv + b * t_n * 3 * width;
        float *dbase = d_qkv + b * t_n * 3 * width;
        for (size_t t = 0; t < t_n; t++) {
            for (size_t h = 0; h < nh; h++) {
                const float *q = base + t * 3 * width + h * hd;
                float *dq = dbase + t * 3 * width + h * hd;
                const float *a = att + ((b * nh + h) * t_n + t) * t_n;
                const float *dy = d_out + (b * t_n + t) * width + h * hd;
                /* Softmax backward needs sum_j a_j * datt_j before any dpreatt; datt_j (dy . v_j)
                 * is recomputed in the second pass rather than kept in a scratch row. */
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
                    float dpre = a[t2] * (datt - adot) * scale;
                    for (size_t i = 0; i < hd; i++) {
                        dv[i] += a[t2] * dy[i];
                        dq[i] += dpre * k[i];
                        dk[i] += dpre * q[i];
                    }
                }
            }
        }
    }
    return MT_OK;
}

/* ---- vocabulary-parallel cross-entropy ------------------------------------------------------- */

mt_status mt_cpu_op_xent_local_max(const float *logits, size_t n, int vocab_local,
                                   float *row_max) {
    size_t v = (size_t)vocab_local;
    for (size_t i = 0; i < n; i++) {
        /* An empty slice gives -inf, the identity of the MAX all-reduce. */
        const float *l = logits + i * v;
        float mx = -INFINITY;
        for (size_t j = 0; j < v; j++)
            if (l[j] > mx) mx = l[j];
        row_max[i] = mx;
    }
    return MT_OK;
}

mt_status mt_cpu_op_xent_local_sums(const float *logits, const int *targets, size_t n,
                                    int vocab_start, int vocab_local, const float *row_max,
                                    float *sum_exp, float *target_logit) {
    size_t v = (size_t)vocab_local;
    for (size_t i = 0; i < n; i++) {
        const float *l = logits + i * v;
        float mx = row_max[i];
        if (!isfinite(mx))
            return mt_error(MT_ERR_INVALID_ARG,
                            "xent_local_sums: row %zu has maximum %g (a non-finite logit, or no "
                            "logits at all)",
                            i, (double)mx);
        /* Every exponent is <= 0 once mx is the all-reduced maximum: nothing overflows. */
        double s = 0.0;
        for (size_t j = 0; j < v; j++) s += exp((double)(l[j] - mx));
        sum_exp[i] = (float)s;
        long r = slice_row(targets[i], vocab_start, vocab_local);
        target_logit[i] = r >= 0 ? l[r] : 0.0f;
    }
    return MT_OK;
}

mt_status mt_cpu_op_xent_loss_backward(const float *logits, const int *targets, size_t n,
                                       int vocab_start, int vocab_local, const float *row_max,
                                       const float *sum_exp, const float *target_logit,
                                       float scale, float *loss, float *d_logits) {
    size_t v = (size_t)vocab_local;
    /* d_logits may be NULL: an evaluation pass wants the loss only. */
    for (size_t i = 0; i < n; i++) {
        if (!(sum_exp[i] > 0.0f) || !isfinite(sum_exp[i]) || !isfinite(row_max[i]))
            return mt_error(MT_ERR_INVALID_ARG,
                            "xent_loss_backward: row %zu has sum %g and maximum %g (were the "
                            "all-reduces done?)",
                            i, (double)sum_exp[i], (double)row_max[i]);
        double lse = log((double)sum_exp[i]) + (double)row_max[i];
        loss[i] = (float)(lse - (double)target_logit[i]);
        if (!d_logits) continue;
        const float *l = logits + i * v;
        float *d = d_logits + i * v;
        /* softmax_j = exp(l_j - lse): one exponential per logit, no division. */
        for (size_t j = 0; j < v; j++)
            d[j] += scale * (float)exp((double)l[j] - lse);
        long r = slice_row(targets[i], vocab_start, vocab_local);
        if (r >= 0) d[r] -= scale;
    }
    return MT_OK;
}
