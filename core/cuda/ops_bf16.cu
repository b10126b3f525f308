/* bf16 matrix products on a CUDA device (mt_op_gemm_ex, mt_op_linear_*_ex with bf16):
 * cublasGemmEx with bf16 A and B, an f32 C and CUBLAS_COMPUTE_32F, as autocast runs a linear.
 * The f32 operands autocast rounds (the linear's input, the output gradient) go through bf16
 * scratch written by mt_cuda_op_cast, so they round exactly as mt_f32_to_bf16 does; the scratch is
 * charged to activations and freed before returning (the caching allocator keeps a freed block
 * until the work queued before the free is done). Row-major to column-major as ops_blas.cu does
 * it: C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T with the operands swapped. */
#include "core/cuda/blas_kernels.cuh"
#include "core/cuda/ops_cuda.h"

#include <stdint.h>
#include <stdio.h>

/* ---- helpers --------------------------------------------------------------------------------- */

static int max1(int x) { return x > 1 ? x : 1; }

/* The bf16 gemm without selecting the device (the caller has). */
static mt_status gemm_bf16(mt_device *dev, const char *op, bool trans_a, bool trans_b, int m,
                           int n, int k, float alpha, const void *a, const void *b, float beta,
                           float *c) {
    if (m == 0 || n == 0) return MT_OK;
    if (k == 0) {
        size_t total = (size_t)m * (size_t)n;
        gemm_beta_kernel<<<mt_cuda_blocks(total, MT_CUDA_THREADS), MT_CUDA_THREADS>>>(c, total,
                                                                                     beta);
        return mt_cuda_ops_launched(dev, op);
    }
    /* Errors name the op and the product's shape. */
    char what[160];
    snprintf(what, sizeof what, "%s (bf16 A %s%d x %d, B %s%d x %d, C %d x %d)", op,
             trans_a ? "transposed " : "", trans_a ? k : m, trans_a ? m : k,
             trans_b ? "transposed " : "", trans_b ? n : k, trans_b ? k : n, m, n);
    cublasHandle_t h;
    MT_TRY(mt_cuda_ops_blas(dev, what, &h));
    int lda = trans_a ? m : k; /* row-major leading dimensions, as stored */
    int ldb = trans_b ? k : n;
    cublasStatus_t st = cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                                     CUDA_R_16BF, max1(ldb), a, CUDA_R_16BF, max1(lda), &beta, c,
                                     CUDA_R_32F, max1(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return mt_cuda_ops_blas_fail(dev, what, "cublasGemmEx", st);
    return MT_OK;
}

/* A bf16 copy of n f32 values in scratch (activations), rounded as mt_f32_to_bf16. */
static mt_status rounded(mt_device *dev, const char *op, const char *what, const float *src,
                         size_t n, uint16_t **out) {
    *out = NULL;
    mt_status st = mt_device_alloc(dev, (n ? n : 1) * sizeof(uint16_t), MT_MEM_ACTIVATIONS,
                                   (void **)out);
    if (st != MT_OK)
        return mt_error_wrap(st, "%s (bf16): scratch for %s (%zu values)", op, what, n);
    st = mt_cuda_op_cast(dev, src, MT_F32, *out, MT_BF16, n);
    if (st != MT_OK) {
        mt_device_free(dev, *out);
        *out = NULL;
        return mt_error_wrap(st, "%s (bf16): rounding %s (%zu values)", op, what, n);
    }
    return MT_OK;
}

/* ---- ops ------------------------------------------------------------------------------------- */

extern "C" mt_status mt_cuda_op_gemm_bf16(mt_device *dev, bool trans_a, bool trans_b, int m,
                                          int n, int k, float alpha, const void *a,
                                          const void *b, float beta, float *c) {
    static const char *op = "gemm_ex";
    MT_TRY(mt_cuda_ops_select(dev, op));
    return gemm_bf16(dev, op, trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
}

extern "C" mt_status mt_cuda_op_linear_forward_bf16(mt_device *dev, const float *in,
                                                    const void *w, const float *bias, float *out,
                                                    int batch, int in_features,
                                                    int out_features) {
    static const char *op = "linear_forward_ex";
    size_t rows = (size_t)batch, cols = (size_t)out_features;
    if (rows * cols == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    uint16_t *in_r = NULL;
    MT_TRY(rounded(dev, op, "the input", in, rows * (size_t)in_features, &in_r));
    bias_rows_kernel<<<mt_cuda_blocks(rows * cols, MT_CUDA_THREADS), MT_CUDA_THREADS>>>(
        out, bias, rows, cols);
    mt_status st = mt_cuda_ops_launched(dev, op);
    if (st == MT_OK)
        st = gemm_bf16(dev, op, false, true, batch, out_features, in_features, 1.0f, in_r, w,
                       1.0f, out);
    mt_device_free(dev, in_r);
    return st;
}

extern "C" mt_status mt_cuda_op_linear_backward_bf16(mt_device *dev, const float *d_out,
                                                     const float *in, const void *w, float *d_in,
                                                     float *d_w, float *d_bias, int batch,
                                                     int in_features, int out_features) {
    static const char *op = "linear_backward_ex";
    size_t rows = (size_t)batch, cols = (size_t)out_features;
    MT_TRY(mt_cuda_ops_select(dev, op));
    uint16_t *g_r = NULL, *in_r = NULL;
    mt_status st = rounded(dev, op, "the output gradient", d_out, rows * cols, &g_r);
    if (st == MT_OK) st = rounded(dev, op, "the input", in, rows * (size_t)in_features, &in_r);
    if (st == MT_OK && d_in)
        st = gemm_bf16(dev, op, false, false, batch, in_features, out_features, 1.0f, g_r, w,
                       1.0f, d_in);
    if (st == MT_OK)
        st = gemm_bf16(dev, op, true, false, out_features, in_features, batch, 1.0f, g_r, in_r,
                       1.0f, d_w);
    /* The bias gradient sums the unrounded f32 gradient: no product, nothing to round. */
    if (st == MT_OK && d_bias && cols > 0) {
        bias_grad_kernel<<<mt_cuda_blocks(cols, MT_CUDA_THREADS), MT_CUDA_THREADS>>>(
            d_bias, d_out, rows, cols);
        st = mt_cuda_ops_launched(dev, op);
    }
    mt_device_free(dev, g_r);
    mt_device_free(dev, in_r);
    return st;
}
