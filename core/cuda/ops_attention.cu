/* Causal self-attention on a CUDA device, in the llm.c manner: the two products of each head are
 * cuBLAS strided-batched GEMMs over the heads of one sequence (one call per sequence, since the
 * heads of a token are hd apart but the sequences T * 3 * width apart), and the softmax and its
 * backward are one block per row of scores. Correct and simple rather than fast: the T x T scores
 * are materialised, as the op's att buffer requires anyway.
 *
 * Layout (row-major): qkv row t of sequence b holds q heads, k heads, v heads, each head hd wide,
 * so head h's Q is a T x hd matrix at qkv + b*T*3W + h*hd with leading dimension 3W (W = heads *
 * hd); K and V sit W and 2W further. att[b][h] is T x T (query row, key column). cuBLAS is
 * column-major: a row-major X (ld x) is the column-major X^T (ld x), which the comments use. */
#include "core/cuda/ops_cuda.h"

/* ---- softmax kernels (one block per query row) ----------------------------------------------- */

/* att row t (scaled scores on entry) becomes the causal softmax: keys t2 <= t, zero beyond. */
__global__ void causal_softmax_kernel(float *att, size_t rows, int seq) {
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int t = (int)(row % (size_t)seq);
        float *a = att + row * (size_t)seq;
        float mx = -INFINITY;
        for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) mx = fmaxf(mx, a[t2]);
        mx = mt_block_max(mx);
        float sum = 0.0f;
        for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
            float e = expf(a[t2] - mx);
            a[t2] = e;
            sum += e;
        }
        sum = mt_block_sum<float>(sum);
        float inv = 1.0f / sum; /* sum >= 1: the maximum contributes exp(0) */
        for (int t2 = threadIdx.x; t2 < seq; t2 += blockDim.x) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
    }
}

/* datt row (dy . v_t2 on entry) becomes dpre = a * (datt - sum_j a_j datt_j) * scale, zero past
 * the diagonal. */
__global__ void causal_softmax_backward_kernel(const float *att, float *datt, size_t rows, int seq,
                                               float scale) {
    for (size_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int t = (int)(row % (size_t)seq);
        const float *a = att + row * (size_t)seq;
        float *d = datt + row * (size_t)seq;
        float adot = 0.0f;
        for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) adot += a[t2] * d[t2];
        adot = mt_block_sum<float>(adot);
        for (int t2 = threadIdx.x; t2 < seq; t2 += blockDim.x)
            d[t2] = t2 <= t ? a[t2] * (d[t2] - adot) * scale : 0.0f;
    }
}

/* ---- batched products ------------------------------------------------------------------------ */

/* One strided-batched SGEMM over the heads; strides in elements. */
static mt_status heads_gemm(mt_device *dev, const char *op, cublasHandle_t h, cublasOperation_t ta,
                            cublasOperation_t tb, int m, int n, int k, float alpha, const float *a,
                            int lda, long long stride_a, const float *b, int ldb,
                            long long stride_b, float beta, float *c, int ldc, long long stride_c,
                            int heads) {
    cublasStatus_t st = cublasSgemmStridedBatched(h, ta, tb, m, n, k, &alpha, a, lda, stride_a, b,
                                                  ldb, stride_b, &beta, c, ldc, stride_c, heads);
    if (st != CUBLAS_STATUS_SUCCESS)
        return mt_cuda_ops_blas_fail(dev, op, "cublasSgemmStridedBatched", st);
    return MT_OK;
}

extern "C" mt_status mt_cuda_op_attention_forward(mt_device *dev, const float *qkv, int batch,
                                                  int seq, int heads, int head_dim, float *out,
                                                  float *att) {
    static const char *op = "attention_forward";
    if (batch == 0 || seq == 0 || heads == 0 || head_dim == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    cublasHandle_t h;
    MT_TRY(mt_cuda_ops_blas(dev, op, &h));
    const int T = seq, hd = head_dim, W = heads * head_dim;
    const long long TT = (long long)T * T;
    float scale = (float)(1.0 / sqrt((double)head_dim));
    for (int b = 0; b < batch; b++) {
        const float *q = qkv + (size_t)b * T * 3 * W, *k = q + W;
        float *a = att + (size_t)b * heads * TT;
        /* Scores S = scale Q K^T (T x T): column-major S^T = K Q^T, K^T and Q^T being the stored
         * matrices (hd x T, ld 3W). */
        MT_TRY(heads_gemm(dev, op, h, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, scale, k, 3 * W, hd, q,
                          3 * W, hd, 0.0f, a, T, TT, heads));
    }
    size_t rows = (size_t)batch * heads * T;
    causal_softmax_kernel<<<mt_cuda_row_blocks(rows), MT_CUDA_THREADS>>>(att, rows, T);
    MT_TRY(mt_cuda_ops_launched(dev, op));
    for (int b = 0; b < batch; b++) {
        const float *v = qkv + (size_t)b * T * 3 * W + 2 * W;
        const float *a = att + (size_t)b * heads * TT;
        float *o = out + (size_t)b * T * W;
        /* O = A V (T x hd): column-major O^T = V^T A^T; V^T is stored (hd x T, ld 3W), A^T is
         * the stored att (T x T, ld T), O^T the stored output (hd x T, ld W). The zeros past the
         * diagonal add nothing. */
        MT_TRY(heads_gemm(dev, op, h, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f, v, 3 * W, hd, a, T,
                          TT, 0.0f, o, W, hd, heads));
    }
    return MT_OK;
}

extern "C" mt_status mt_cuda_op_attention_backward(mt_device *dev, const float *d_out,
                                                   const float *qkv, const float *att, int batch,
                                                   int seq, int heads, int head_dim,
                                                   float *d_qkv) {
    static const char *op = "attention_backward";
    if (batch == 0 || seq == 0 || heads == 0 || head_dim == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    cublasHandle_t h;
    MT_TRY(mt_cuda_ops_blas(dev, op, &h));
    const int T = seq, hd = head_dim, W = heads * head_dim;
    const long long TT = (long long)T * T;
    float scale = (float)(1.0 / sqrt((double)head_dim));
    /* Scratch for one sequence's score gradients (heads x T x T), charged to activations. */
    float *datt = NULL;
    MT_TRY(mt_device_alloc(dev, (size_t)heads * (size_t)TT * sizeof(float), MT_MEM_ACTIVATIONS,
                           (void **)&datt));
    mt_status st = MT_OK;
    size_t rows = (size_t)heads * T;
    for (int b = 0; b < batch && st == MT_OK; b++) {
        size_t base = (size_t)b * T * 3 * W;
        const float *q = qkv + base, *k = q + W, *v = q + 2 * W;
        float *dq = d_qkv + base, *dk = dq + W, *dv = dq + 2 * W;
        const float *dy = d_out + (size_t)b * T * W;
        const float *a = att + (size_t)b * heads * TT;
        /* dA = dO V^T (T x T): column-major dA^T = V dO^T, V^T and dO^T stored (hd x T). */
        st = heads_gemm(dev, op, h, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, 1.0f, v, 3 * W, hd, dy, W,
                        hd, 0.0f, datt, T, TT, heads);
        /* dV += A^T dO (T x hd): column-major dV^T = dO^T A; dO^T stored, A = (stored A^T)^T. */
        if (st == MT_OK)
            st = heads_gemm(dev, op, h, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f, dy, W, hd, a, T,
                            TT, 1.0f, dv, 3 * W, hd, heads);
        if (st == MT_OK) {
            causal_softmax_backward_kernel<<<mt_cuda_row_blocks(rows), MT_CUDA_THREADS>>>(
                a, datt, rows, T, scale);
            st = mt_cuda_ops_launched(dev, op);
        }
        /* dQ += dP K (T x hd), dP = datt now holding the scaled pre-softmax gradient:
         * column-major dQ^T = K^T dP^T, both stored as they are. */
        if (st == MT_OK)
            st = heads_gemm(dev, op, h, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f, k, 3 * W, hd,
                            datt, T, TT, 1.0f, dq, 3 * W, hd, heads);
        /* dK += dP^T Q (T x hd): column-major dK^T = Q^T dP; Q^T stored, dP = (stored dP^T)^T. */
        if (st == MT_OK)
            st = heads_gemm(dev, op, h, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f, q, 3 * W, hd,
                            datt, T, TT, 1.0f, dk, 3 * W, hd, heads);
    }
    /* Freeing while the kernels may still run is safe: the device's allocator hands a block out
     * again only after the work queued before the free has finished. */
    mt_device_free(dev, datt);
    return st;
}
