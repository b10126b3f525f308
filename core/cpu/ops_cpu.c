/* Compute ops (include/meshtrain/ops.h) on the CPU device: matrix products in ops_gemm.c,
 * AdamW through the host AdamW (core/cpu/adamw_host.h), everything else as flat loops the
 * compiler vectorises. core/ops.c has checked the arguments. */
#include "core/cpu/ops_cpu.h"

#include "core/cpu/adamw_host.h"
#include "core/cpu/parallel.h"
#include "core/error.h"
#include "core/thread_pool.h"

#include <math.h>
#include <stdint.h>

typedef struct bias_job {
    const float *src;
    float *dst;
    size_t rows, cols;
    bool zero_first; /* column sums: dst starts from 0 (overwrite) */
} bias_job;

/* Rows [begin, end) of out set to the bias (or 0). */
static void bias_rows(void *ctx, size_t chunk, size_t begin, size_t end) {
    const bias_job *j = ctx;
    for (size_t r = begin; r < end; r++) {
        float *o = j->dst + r * j->cols;
        if (j->src)
            for (size_t k = 0; k < j->cols; k++) o[k] = j->src[k];
        else
            for (size_t k = 0; k < j->cols; k++) o[k] = 0.0f;
    }
}

mt_status mt_cpu_bias_rows(const float *bias, float *out, size_t rows, size_t cols) {
    bias_job job = {bias, out, rows, cols, false};
    return mt_cpu_parallel("linear_forward", rows, mt_cpu_row_grain(cols), bias_rows, &job);
}

mt_status mt_cpu_op_linear_forward(const float *in, const float *w, const float *bias, float *out,
                                   int batch, int in_features, int out_features) {
    size_t rows = (size_t)batch, cols = (size_t)out_features;
    /* Start from the bias rows so that the product adds onto them (beta = 1). */
    MT_TRY(mt_cpu_bias_rows(bias, out, rows, cols));
    return mt_cpu_op_gemm(false, true, batch, out_features, in_features, 1.0f, in, w, 1.0f, out);
}

mt_status mt_cpu_op_linear_backward(const float *d_out, const float *in, const float *w,
                                    float *d_in, float *d_w, float *d_bias, int batch,
                                    int in_features, int out_features, unsigned overwrite) {
    size_t rows = (size_t)batch, cols = (size_t)out_features;
    /* beta 0: sgemm zeroes C and then adds the product, the same bits as beta 1 on zeros
     * without reading C. */
    float beta_in = overwrite & MT_OVERWRITE_D_IN ? 0.0f : 1.0f;
    float beta_w = overwrite & MT_OVERWRITE_D_W ? 0.0f : 1.0f;
    if (d_in)
        MT_TRY(mt_cpu_op_gemm(false, false, batch, in_features, out_features, 1.0f, d_out, w,
                              beta_in, d_in));
    MT_TRY(mt_cpu_op_gemm(true, false, out_features, in_features, batch, 1.0f, d_out, in, beta_w,
                          d_w));
    if (!d_bias) return MT_OK;
    return mt_cpu_column_sums(d_out, rows, cols, d_bias, (overwrite & MT_OVERWRITE_D_BIAS) != 0);
}

/* Columns [begin, end) of d_bias, the rows in order: any split gives one thread's bits. With
 * zero_first (overwrite) the columns start from 0. */
static void column_sums(void *ctx, size_t chunk, size_t begin, size_t end) {
    const bias_job *j = ctx;
    if (j->zero_first)
        for (size_t k = begin; k < end; k++) j->dst[k] = 0.0f;
    for (size_t r = 0; r < j->rows; r++) {
        const float *row = j->src + r * j->cols;
        for (size_t k = begin; k < end; k++) j->dst[k] += row[k];
    }
}

mt_status mt_cpu_column_sums(const float *g, size_t rows, size_t cols, float *d_bias,
                             bool overwrite) {
    if (rows == 0 && !overwrite) return MT_OK;
    bias_job job = {g, d_bias, rows, cols, overwrite};
    return mt_cpu_parallel("column sums", cols, MT_CPU_COL_GRAIN, column_sums, &job);
}

mt_status mt_cpu_add_column_sums(const float *g, size_t rows, size_t cols, float *d_bias) {
    return mt_cpu_column_sums(g, rows, cols, d_bias, false);
}

mt_status mt_cpu_op_relu_forward(const float *in, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
    return MT_OK;
}

mt_status mt_cpu_op_relu_backward(const float *out, const float *d_out, float *d_in, size_t n) {
    for (size_t i = 0; i < n; i++) d_in[i] += out[i] > 0.0f ? d_out[i] : 0.0f;
    return MT_OK;
}

mt_status mt_cpu_op_mse_forward(const float *pred, const float *target, size_t n, float *loss) {
    /* Double accumulation: the loss is compared across rank counts, where a float sum's
     * order-dependent rounding would show. */
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)pred[i] - (double)target[i];
        sum += d * d;
    }
    *loss = (float)(sum / (double)n);
    return MT_OK;
}

mt_status mt_cpu_op_mse_backward(const float *pred, const float *target, size_t n, float scale,
                                 float *d_pred) {
    float k = (float)(2.0 * (double)scale / (double)n);
    for (size_t i = 0; i < n; i++) d_pred[i] += k * (pred[i] - target[i]);
    return MT_OK;
}

mt_status mt_cpu_op_adamw(float *param, const float *grad, float *m, float *v, size_t n, long t,
                          float lr, float beta1, float beta2, float eps, float weight_decay) {
    return mt_cpu_op_adamw_scaled(param, grad, 1.0f, m, v, n, t, lr, beta1, beta2, eps,
                                  weight_decay);
}

mt_status mt_cpu_op_adamw_scaled(float *param, const float *grad, float grad_scale, float *m,
                                 float *v, size_t n, long t, float lr, float beta1, float beta2,
                                 float eps, float weight_decay) {
    /* The host AdamW of CPU offload is this op: one code, one set of bits. */
    mt_thread_pool *pool = NULL;
    mt_adamw_isa isa = MT_ADAMW_SCALAR;
    MT_TRY(mt_thread_pool_get(&pool));
    MT_TRY(mt_adamw_isa_select(&isa));
    return mt_host_adamw_scaled(pool, isa, param, grad, grad_scale, m, v, n, t, lr, beta1, beta2,
                                eps, weight_decay);
}
