/* Matrix products on a CUDA device: mt_op_gemm through cublasSgemm (f32 in, f32 accumulate) and
 * the linear layer around it (bias rows, bias gradient). Our matrices are row-major and cuBLAS's
 * are column-major: a row-major X is the column-major X^T, so C = op(A) op(B) is computed as
 * C^T = op(B)^T op(A)^T with the operands swapped, and no data moves. */
#include "core/cuda/blas_kernels.cuh"
#include "core/cuda/ops_cuda.h"

#include <pthread.h>

/* ---- the per-GPU cuBLAS handles -------------------------------------------------------------- */

/* More GPUs than one process can see on any machine we know of. */
#define MAX_GPUS 64

static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;
static cublasHandle_t handles[MAX_GPUS];

mt_status mt_cuda_ops_blas_fail(mt_device *dev, const char *op, const char *call,
                                cublasStatus_t st) {
    return mt_error(st == CUBLAS_STATUS_ALLOC_FAILED ? MT_ERR_OUT_OF_MEMORY : MT_ERR_SYSTEM,
                    "%s on %s: %s failed: %s (%s)", op, mt_device_name(dev), call,
                    cublasGetStatusString(st), cublasGetStatusName(st));
}

mt_status mt_cuda_ops_blas(mt_device *dev, const char *op, cublasHandle_t *out) {
    int index = mt_device_index(dev);
    if (index < 0 || index >= MAX_GPUS)
        return mt_error(MT_ERR_UNSUPPORTED, "%s on %s: GPU index %d is beyond the %d this build "
                        "keeps cuBLAS handles for", op, mt_device_name(dev), index, MAX_GPUS);
    mt_status status = MT_OK;
    pthread_mutex_lock(&handles_lock);
    if (!handles[index]) {
        /* The handle binds to the current device, which the caller has selected. */
        cublasHandle_t h = NULL;
        cublasStatus_t st = cublasCreate(&h);
        if (st == CUBLAS_STATUS_SUCCESS) {
            /* Plain f32 arithmetic (no TF32 tensor cores): results comparable with the CPU's. */
            st = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
            if (st != CUBLAS_STATUS_SUCCESS) {
                cublasDestroy(h);
                status = mt_cuda_ops_blas_fail(dev, op, "cublasSetMathMode", st);
            } else {
                handles[index] = h;
            }
        } else {
            status = mt_cuda_ops_blas_fail(dev, op, "cublasCreate", st);
        }
    }
    *out = handles[index];
    pthread_mutex_unlock(&handles_lock);
    return status;
}

/* ---- kernels --------------------------------------------------------------------------------- */

/* C = beta * C when the product is empty (k = 0): cuBLAS, like BLAS, wants leading dimensions of
 * at least 1, and beta = 0 must give 0 even where C held NaN. */
__global__ void gemm_beta_kernel(float *c, size_t n, float beta) {
    MT_GRID_STRIDE(i, n) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
}

/* Every row of out (rows x cols) starts as the bias (or 0), so that the product adds onto it. */
__global__ void bias_rows_kernel(float *out, const float *bias, size_t rows, size_t cols) {
    MT_GRID_STRIDE(i, rows * cols) out[i] = bias ? bias[i % cols] : 0.0f;
}

/* d_bias[j] += column sums of g (rows x cols). One thread per column adds the rows in order, as
 * the CPU does, so both round the same way; the loads of a warp are adjacent columns. */
__global__ void bias_grad_kernel(float *d_bias, const float *g, size_t rows, size_t cols) {
    MT_GRID_STRIDE(j, cols) {
        float acc = d_bias[j];
        for (size_t r = 0; r < rows; r++) acc += g[r * cols + j];
        d_bias[j] = acc;
    }
}

/* ---- ops ------------------------------------------------------------------------------------- */

static int max1(int x) { return x > 1 ? x : 1; }

/* The gemm without selecting the device (the caller has). */
static mt_status gemm(mt_device *dev, const char *op, bool trans_a, bool trans_b, int m, int n,
                      int k, float alpha, const float *a, const float *b, float beta, float *c) {
    if (m == 0 || n == 0) return MT_OK;
    if (k == 0) {
        size_t total = (size_t)m * (size_t)n;
        MT_CUDA_LAUNCH(gemm_beta_kernel, total, c, total, beta);
        return mt_cuda_ops_launched(dev, op);
    }
    cublasHandle_t h;
    MT_TRY(mt_cuda_ops_blas(dev, op, &h));
    int lda = trans_a ? m : k; /* row-major leading dimensions, as stored */
    int ldb = trans_b ? k : n;
    cublasStatus_t st = cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                                    max1(ldb), a, max1(lda), &beta, c, max1(n));
    if (st != CUBLAS_STATUS_SUCCESS) return mt_cuda_ops_blas_fail(dev, op, "cublasSgemm", st);
    return MT_OK;
}

extern "C" mt_status mt_cuda_op_gemm(mt_device *dev, bool trans_a, bool trans_b, int m, int n,
                                     int k, float alpha, const float *a, const float *b,
                                     float beta, float *c) {
    static const char *op = "gemm";
    MT_TRY(mt_cuda_ops_select(dev, op));
    return gemm(dev, op, trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
}

extern "C" mt_status mt_cuda_op_linear_forward(mt_device *dev, const float *in, const float *w,
                                               const float *bias, float *out, int batch,
                                               int in_features, int out_features) {
    static const char *op = "linear_forward";
    size_t rows = (size_t)batch, cols = (size_t)out_features;
    if (rows * cols == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    bias_rows_kernel<<<mt_cuda_blocks(rows * cols, MT_CUDA_THREADS), MT_CUDA_THREADS>>>(
        out, bias, rows, cols);
    MT_TRY(mt_cuda_ops_launched(dev, op));
    return gemm(dev, op, false, true, batch, out_features, in_features, 1.0f, in, w, 1.0f, out);
}

extern "C" mt_status mt_cuda_op_linear_backward(mt_device *dev, const float *d_out,
                                                const float *in, const float *w, float *d_in,
                                                float *d_w, float *d_bias, int batch,
                                                int in_features, int out_features) {
    static const char *op = "linear_backward";
    size_t rows = (size_t)batch, cols = (size_t)out_features;
    MT_TRY(mt_cuda_ops_select(dev, op));
    if (d_in)
        MT_TRY(gemm(dev, op, false, false, batch, in_features, out_features, 1.0f, d_out, w, 1.0f,
                    d_in));
    MT_TRY(gemm(dev, op, true, false, out_features, in_features, batch, 1.0f, d_out, in, 1.0f,
                d_w));
    if (d_bias && cols > 0) {
        bias_grad_kernel<<<mt_cuda_blocks(cols, MT_CUDA_THREADS), MT_CUDA_THREADS>>>(d_bias, d_out,
                                                                                   rows, cols);
        MT_TRY(mt_cuda_ops_launched(dev, op));
    }
    return MT_OK;
}
