/* LayerNorm on the CPU device (include/meshtrain/ops.h, "GPT ops"), split over the rank's pool.
 * Each row's statistics accumulate in double, in one thread: channel k into lane k mod LN_LANES,
 * the lanes folded in halves at the end, a fixed order that depends on the row's length only,
 * so the same bits whatever the split, and the accuracy the tp equivalence tests rely on. The
 * lanes are independent dependency chains that the compiler vectorises; one chain in channel
 * order, as before, bounded a row by the latency of its additions (docs/cpu-kernels.md,
 * "LayerNorm"). d_gamma and d_beta sum over rows, so the backward runs twice over the rows: once
 * split by rows for d_in, once split by columns for the parameter gradients, each chunk adding
 * every row in order. */
#include "core/cpu/ops_cpu.h"
#include "core/cpu/parallel.h"

#include <math.h>

static const double layernorm_eps = 1e-5;

#define LN_LANES 8

/* lane[0] after folding the lanes in halves: (0+4, 1+5, 2+6, 3+7), then (0+2, 1+3), then 0+1. */
static double fold_lanes(double lane[LN_LANES]) {
    for (size_t w = LN_LANES / 2; w > 0; w /= 2)
        for (size_t l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

typedef struct ln_job {
    const float *in, *d_out, *gamma, *beta;
    float *out, *mean, *rstd, *d_in, *d_gamma, *d_beta;
    const float *saved_mean, *saved_rstd;
    size_t n, c;
    unsigned overwrite; /* backward: MT_OVERWRITE_* outputs start from 0 */
} ln_job;

static void ln_forward_rows(void *ctx, size_t chunk, size_t begin, size_t end) {
    const ln_job *j = ctx;
    size_t c = j->c;
    for (size_t i = begin; i < end; i++) {
        const float *x = j->in + i * c;
        double lane[LN_LANES] = {0};
        size_t k = 0;
        for (; k + LN_LANES <= c; k += LN_LANES)
            for (size_t l = 0; l < LN_LANES; l++) lane[l] += x[k + l];
        for (size_t l = 0; k < c; k++, l++) lane[l] += x[k];
        double m = fold_lanes(lane) / (double)c;
        /* Two passes: the variance from the centred values does not cancel catastrophically. */
        double vl[LN_LANES] = {0};
        for (k = 0; k + LN_LANES <= c; k += LN_LANES)
            for (size_t l = 0; l < LN_LANES; l++) {
                double d = x[k + l] - m;
                vl[l] += d * d;
            }
        for (size_t l = 0; k < c; k++, l++) {
            double d = x[k] - m;
            vl[l] += d * d;
        }
        double v = fold_lanes(vl) / (double)c;
        float mf = (float)m, rs = (float)(1.0 / sqrt(v + layernorm_eps));
        float *o = j->out + i * c;
        for (k = 0; k < c; k++) o[k] = (x[k] - mf) * rs * j->gamma[k] + j->beta[k];
        j->mean[i] = mf;
        j->rstd[i] = rs;
    }
}

mt_status mt_cpu_op_layernorm_forward(const float *in, const float *gamma, const float *beta,
                                      size_t n, int channels, float *out, float *mean,
                                      float *rstd) {
    size_t c = channels > 0 ? (size_t)channels : 0;
    ln_job job = {.in = in, .gamma = gamma, .beta = beta, .out = out, .mean = mean, .rstd = rstd,
                  .n = n, .c = c};
    return mt_cpu_parallel("layernorm_forward", n, mt_cpu_row_grain(c), ln_forward_rows, &job);
}

static void ln_backward_rows(void *ctx, size_t chunk, size_t begin, size_t end) {
    const ln_job *j = ctx;
    size_t c = j->c;
    const float *gamma = j->gamma;
    for (size_t i = begin; i < end; i++) {
        const float *x = j->in + i * c, *dy = j->d_out + i * c;
        float m = j->saved_mean[i], rs = j->saved_rstd[i];
        /* d_in = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dy * gamma. */
        double ml[LN_LANES] = {0}, nl[LN_LANES] = {0};
        size_t k = 0;
        for (; k + LN_LANES <= c; k += LN_LANES)
            for (size_t l = 0; l < LN_LANES; l++) {
                double norm = (double)((x[k + l] - m) * rs);
                double dn = (double)gamma[k + l] * dy[k + l];
                ml[l] += dn;
                nl[l] += dn * norm;
            }
        for (size_t l = 0; k < c; k++, l++) {
            double norm = (double)((x[k] - m) * rs);
            double dn = (double)gamma[k] * dy[k];
            ml[l] += dn;
            nl[l] += dn * norm;
        }
        double dn_mean = fold_lanes(ml) / (double)c;
        double dn_norm_mean = fold_lanes(nl) / (double)c;
        float *dx = j->d_in + i * c;
        bool from_zero = (j->overwrite & MT_OVERWRITE_D_IN) != 0;
        for (k = 0; k < c; k++) {
            float norm = (x[k] - m) * rs;
            float dn = gamma[k] * dy[k];
            float prev = from_zero ? 0.0f : dx[k];
            dx[k] = prev + (float)(((double)dn - dn_mean - (double)norm * dn_norm_mean) * rs);
        }
    }
}

/* Columns [begin, end) of d_gamma and d_beta, the rows in order. */
static void ln_backward_cols(void *ctx, size_t chunk, size_t begin, size_t end) {
    const ln_job *j = ctx;
    size_t c = j->c;
    float *dg = j->d_gamma, *db = j->d_beta;
    if (j->overwrite & MT_OVERWRITE_D_W)
        for (size_t k = begin; k < end; k++) dg[k] = 0.0f;
    if (j->overwrite & MT_OVERWRITE_D_BIAS)
        for (size_t k = begin; k < end; k++) db[k] = 0.0f;
    for (size_t i = 0; i < j->n; i++) {
        const float *x = j->in + i * c, *dy = j->d_out + i * c;
        float m = j->saved_mean[i], rs = j->saved_rstd[i];
        for (size_t k = begin; k < end; k++) {
            float norm = (x[k] - m) * rs;
            db[k] += dy[k];
            dg[k] += norm * dy[k];
        }
    }
}

mt_status mt_cpu_op_layernorm_backward(const float *d_out, const float *in, const float *gamma,
                                       const float *mean, const float *rstd, size_t n,
                                       int channels, float *d_in, float *d_gamma, float *d_beta,
                                       unsigned overwrite) {
    size_t c = channels > 0 ? (size_t)channels : 0;
    ln_job job = {.in = in, .d_out = d_out, .gamma = gamma, .d_in = d_in, .d_gamma = d_gamma,
                  .d_beta = d_beta, .saved_mean = mean, .saved_rstd = rstd, .n = n, .c = c,
                  .overwrite = overwrite};
    MT_TRY(mt_cpu_parallel("layernorm_backward", n, mt_cpu_row_grain(c), ln_backward_rows, &job));
    if (n == 0 && !(overwrite & (MT_OVERWRITE_D_W | MT_OVERWRITE_D_BIAS))) return MT_OK;
    return mt_cpu_parallel("layernorm_backward", c, MT_CPU_COL_GRAIN, ln_backward_cols, &job);
}
