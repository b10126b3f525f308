/* Internal: the CUDA implementations of the compute ops (include/meshtrain/ops.h), compiled only
 * with MT_HAVE_CUDA. core/ops.c has already checked every argument that needs no look at the
 * data; these take device pointers (the mse loss may be host or device memory) and queue their
 * kernels on the device's default stream, so they return before the GPU is done unless they must
 * read a result back (the mse loss, the cross-entropy's row checks).
 *
 * cuBLAS: one handle per GPU index, created on first use and kept in a small table for the life of
 * the process: the driver reclaims them with the context at exit. They are not destroyed from an
 * atexit handler (the CUDA runtime may already be torn down then) nor when a device closes
 * (another device of the process may still use that GPU). */
#ifndef MT_CORE_CUDA_OPS_CUDA_H
#define MT_CORE_CUDA_OPS_CUDA_H

#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

mt_status mt_cuda_op_gemm(mt_device *dev, bool trans_a, bool trans_b, int m, int n, int k,
                          float alpha, const float *a, const float *b, float beta, float *c);
mt_status mt_cuda_op_linear_forward(mt_device *dev, const float *in, const float *w,
                                    const float *bias, float *out, int batch, int in_features,
                                    int out_features);
mt_status mt_cuda_op_linear_backward(mt_device *dev, const float *d_out, const float *in,
                                     const float *w, float *d_in, float *d_w, float *d_bias,
                                     int batch, int in_features, int out_features);
/* bf16 inputs, f32 output and accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F). */
mt_status mt_cuda_op_gemm_bf16(mt_device *dev, bool trans_a, bool trans_b, int m, int n, int k,
                               float alpha, const void *a, const void *b, float beta, float *c);
mt_status mt_cuda_op_linear_forward_bf16(mt_device *dev, const float *in, const void *w,
                                         const float *bias, float *out, int batch,
                                         int in_features, int out_features);
mt_status mt_cuda_op_linear_backward_bf16(mt_device *dev, const float *d_out, const float *in,
                                          const void *w, float *d_in, float *d_w, float *d_bias,
                                          int batch, int in_features, int out_features);
mt_status mt_cuda_op_sum_squares(mt_device *dev, const float *x, size_t n, double *acc);
mt_status mt_cuda_op_scale(mt_device *dev, float *x, float factor, size_t n);
mt_status mt_cuda_op_cast(mt_device *dev, const void *src, mt_dtype src_dtype, void *dst,
                          mt_dtype dst_dtype, size_t n);
mt_status mt_cuda_op_accumulate(mt_device *dev, float *dst, const void *src, mt_dtype src_dtype,
                                size_t n);
mt_status mt_cuda_op_relu_forward(mt_device *dev, const float *in, float *out, size_t n);
mt_status mt_cuda_op_relu_backward(mt_device *dev, const float *out, const float *d_out,
                                   float *d_in, size_t n);
mt_status mt_cuda_op_mse_forward(mt_device *dev, const float *pred, const float *target, size_t n,
                                 float *loss);
mt_status mt_cuda_op_mse_backward(mt_device *dev, const float *pred, const float *target,
                                  size_t n, float scale, float *d_pred);
mt_status mt_cuda_op_adamw(mt_device *dev, float *param, const float *grad, float *m, float *v,
                           size_t n, long t, float lr, float beta1, float beta2, float eps,
                           float weight_decay);

mt_status mt_cuda_op_embedding_forward(mt_device *dev, const int *ids, size_t n, const float *wte,
                                       int vocab_start, int vocab_local, int channels, float *out,
                                       bool accumulate);
mt_status mt_cuda_op_embedding_backward(mt_device *dev, const int *ids, size_t n,
                                        const float *d_out, int vocab_start, int vocab_local,
                                        int channels, float *d_wte);
mt_status mt_cuda_op_position_forward(mt_device *dev, const float *wpe, int batch, int seq,
                                      int channels, float *out);
mt_status mt_cuda_op_position_backward(mt_device *dev, const float *d_out, int batch, int seq,
                                       int channels, float *d_wpe);
mt_status mt_cuda_op_layernorm_forward(mt_device *dev, const float *in, const float *gamma,
                                       const float *beta, size_t n, int channels, float *out,
                                       float *mean, float *rstd);
mt_status mt_cuda_op_layernorm_backward(mt_device *dev, const float *d_out, const float *in,
                                        const float *gamma, const float *mean, const float *rstd,
                                        size_t n, int channels, float *d_in, float *d_gamma,
                                        float *d_beta);
mt_status mt_cuda_op_gelu_forward(mt_device *dev, const float *in, float *out, size_t n);
mt_status mt_cuda_op_gelu_backward(mt_device *dev, const float *in, const float *d_out,
                                   float *d_in, size_t n);
mt_status mt_cuda_op_add(mt_device *dev, const float *a, const float *b, float *out, size_t n);
mt_status mt_cuda_op_tanh_forward(mt_device *dev, const float *in, float *out, size_t n);
mt_status mt_cuda_op_tanh_backward(mt_device *dev, const float *out, const float *d_out,
                                   float *d_in, size_t n);
mt_status mt_cuda_op_sigmoid_forward(mt_device *dev, const float *in, float *out, size_t n);
mt_status mt_cuda_op_sigmoid_backward(mt_device *dev, const float *out, const float *d_out,
                                      float *d_in, size_t n);
mt_status mt_cuda_op_silu_forward(mt_device *dev, const float *in, float *out, size_t n);
mt_status mt_cuda_op_silu_backward(mt_device *dev, const float *in, const float *d_out,
                                   float *d_in, size_t n);
mt_status mt_cuda_op_mul(mt_device *dev, const float *a, const float *b, float *out, size_t n);
mt_status mt_cuda_op_mul_backward(mt_device *dev, const float *a, const float *b,
                                  const float *d_out, float *d_a, float *d_b, size_t n);
mt_status mt_cuda_op_attention_forward(mt_device *dev, const float *qkv, int batch, int seq,
                                       int heads, int head_dim, float *out, float *att);
mt_status mt_cuda_op_attention_backward(mt_device *dev, const float *d_out, const float *qkv,
                                        const float *att, int batch, int seq, int heads,
                                        int head_dim, float *d_qkv);
mt_status mt_cuda_op_xent_local_max(mt_device *dev, const float *logits, size_t n,
                                    int vocab_local, float *row_max);
mt_status mt_cuda_op_xent_local_sums(mt_device *dev, const float *logits, const int *targets,
                                     size_t n, int vocab_start, int vocab_local,
                                     const float *row_max, float *sum_exp, float *target_logit);
mt_status mt_cuda_op_xent_loss_backward(mt_device *dev, const float *logits, const int *targets,
                                        size_t n, int vocab_start, int vocab_local,
                                        const float *row_max, const float *sum_exp,
                                        const float *target_logit, float scale, float *loss,
                                        float *d_logits);

#ifdef __cplusplus
}
#endif

/* ---- helpers shared by the kernel files (CUDA C++ only) ------------------------------------- */
#ifdef __CUDACC__
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "core/error.h"
}

/* Threads per block of the elementwise and per-row kernels. */
#define MT_CUDA_THREADS 256

/* A grid-stride loop: i runs over [0, n) across every thread of the grid. */
#define MT_GRID_STRIDE(i, n)                                                                       \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

/* Launches a grid-stride kernel over n items on the legacy default stream, the stream
 * mt_device_compute_stream (core/device.c) gives users: change both together. */
#define MT_CUDA_LAUNCH(kernel, n, ...)                                                             \
    kernel<<<mt_cuda_blocks((n), MT_CUDA_THREADS), MT_CUDA_THREADS>>>(__VA_ARGS__)

/* Selects dev's GPU for the calling thread: the runtime's current device is per thread, and the
 * comm progress thread may have left another one current. */
static inline mt_status mt_cuda_ops_select(mt_device *dev, const char *op) {
    cudaError_t err = cudaSetDevice(mt_device_index(dev));
    if (err != cudaSuccess) {
        (void)cudaGetLastError(); /* or the next op's launch check would report it as its own */
        return mt_error(MT_ERR_SYSTEM, "%s: selecting %s failed: %s", op, mt_device_name(dev),
                        cudaGetErrorString(err));
    }
    return MT_OK;
}

/* Turns a launch error (bad configuration, a fault left by earlier work) into a sentence. */
static inline mt_status mt_cuda_ops_launched(mt_device *dev, const char *op) {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        return mt_error(err == cudaErrorMemoryAllocation ? MT_ERR_OUT_OF_MEMORY : MT_ERR_SYSTEM,
                        "%s on %s: kernel launch failed: %s (%s)", op, mt_device_name(dev),
                        cudaGetErrorString(err), cudaGetErrorName(err));
    return MT_OK;
}

/* The cuBLAS handle of dev's GPU (core/cuda/ops_blas.cu), created on first use; dev's GPU must
 * be current (mt_cuda_ops_select). */
mt_status mt_cuda_ops_blas(mt_device *dev, const char *op, cublasHandle_t *out);

/* Turns a cuBLAS status into a sentence naming the op and the call. */
mt_status mt_cuda_ops_blas_fail(mt_device *dev, const char *op, const char *call,
                                cublasStatus_t st);

/* Blocks for a grid-stride loop over n items: enough to fill the GPU, never more than the grid
 * allows (the loops cover the rest). */
static inline unsigned mt_cuda_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    const size_t cap = 65536u * 16u;
    if (b > cap) b = cap;
    return b > 0 ? (unsigned)b : 1u;
}

/* Blocks for the per-row kernels: one per row (rows > 0), the rest covered by their row loops. */
static inline unsigned mt_cuda_row_blocks(size_t rows) { return mt_cuda_blocks(rows, 1); }

/* Sum over a block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
 * Every thread of the block must call it (it synchronises). */
template <typename T> __device__ inline T mt_block_sum(T v) {
    __shared__ T partial[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads(); /* the previous call's readers are done with partial */
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    T s = lane < warps ? partial[lane] : (T)0;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

/* Maximum over a block, same rules as mt_block_sum. */
__device__ inline float mt_block_max(float v) {
    __shared__ float partial[32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float s = lane < warps ? partial[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, o));
    return s;
}
#endif

#endif
