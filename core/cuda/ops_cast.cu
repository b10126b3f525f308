/* Casts between f32 and bf16 on a CUDA device (mt_op_cast, mt_op_accumulate). The rounding is the
 * CPU's rule (core/bf16_inline.h) on the bit patterns, so both devices give the same bits. */
#include "core/cuda/ops_cuda.h"

#include <stdint.h>

__device__ static inline uint16_t bf16_round(float value) {
    uint32_t bits = __float_as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u);
    uint32_t lsb = (bits >> 16) & 1u;
    return (uint16_t)((bits + 0x7fffu + lsb) >> 16);
}

__device__ static inline float bf16_widen(uint16_t value) {
    return __uint_as_float((uint32_t)value << 16);
}

__global__ void f32_to_bf16_kernel(const float *src, uint16_t *dst, size_t n) {
    MT_GRID_STRIDE(i, n) dst[i] = bf16_round(src[i]);
}

__global__ void bf16_to_f32_kernel(const uint16_t *src, float *dst, size_t n) {
    MT_GRID_STRIDE(i, n) dst[i] = bf16_widen(src[i]);
}

__global__ void accumulate_f32_kernel(float *dst, const float *src, size_t n) {
    MT_GRID_STRIDE(i, n) dst[i] += src[i];
}

__global__ void accumulate_bf16_kernel(float *dst, const uint16_t *src, size_t n) {
    MT_GRID_STRIDE(i, n) dst[i] += bf16_widen(src[i]);
}

extern "C" mt_status mt_cuda_op_cast(mt_device *dev, const void *src, mt_dtype src_dtype,
                                     void *dst, mt_dtype dst_dtype, size_t n) {
    static const char *op = "cast";
    MT_TRY(mt_cuda_ops_select(dev, op));
    if (n == 0) return MT_OK;
    if (src_dtype == dst_dtype) {
        cudaError_t err = cudaMemcpyAsync(dst, src, n * mt_dtype_size(src_dtype),
                                          cudaMemcpyDeviceToDevice, 0);
        if (err != cudaSuccess) {
            (void)cudaGetLastError(); /* not the next op's error */
            return mt_error(MT_ERR_SYSTEM, "%s on %s: cudaMemcpyAsync failed: %s", op,
                            mt_device_name(dev), cudaGetErrorString(err));
        }
        return MT_OK;
    }
    unsigned blocks = mt_cuda_blocks(n, MT_CUDA_THREADS);
    if (src_dtype == MT_F32)
        f32_to_bf16_kernel<<<blocks, MT_CUDA_THREADS>>>((const float *)src, (uint16_t *)dst, n);
    else
        bf16_to_f32_kernel<<<blocks, MT_CUDA_THREADS>>>((const uint16_t *)src, (float *)dst, n);
    return mt_cuda_ops_launched(dev, op);
}

extern "C" mt_status mt_cuda_op_accumulate(mt_device *dev, float *dst, const void *src,
                                           mt_dtype src_dtype, size_t n) {
    static const char *op = "accumulate";
    MT_TRY(mt_cuda_ops_select(dev, op));
    if (n == 0) return MT_OK;
    unsigned blocks = mt_cuda_blocks(n, MT_CUDA_THREADS);
    if (src_dtype == MT_F32)
        accumulate_f32_kernel<<<blocks, MT_CUDA_THREADS>>>(dst, (const float *)src, n);
    else
        accumulate_bf16_kernel<<<blocks, MT_CUDA_THREADS>>>(dst, (const uint16_t *)src, n);
    return mt_cuda_ops_launched(dev, op);
}

/* ---- the NCCL path's average (comm/nccl/nccl_coll.c) ---------------------------------------------- */

__global__ void scale_bf16_kernel(uint16_t *x, size_t n, float factor) {
    MT_GRID_STRIDE(i, n) x[i] = bf16_round(bf16_widen(x[i]) * factor);
}

__global__ void scale_f32_kernel(float *x, size_t n, float factor) {
    MT_GRID_STRIDE(i, n) x[i] *= factor;
}

extern "C" cudaError_t mt_cuda_scale_on_stream(void *x, mt_dtype dtype, size_t n, float factor,
                                               cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    unsigned blocks = mt_cuda_blocks(n, MT_CUDA_THREADS);
    if (dtype == MT_BF16)
        scale_bf16_kernel<<<blocks, MT_CUDA_THREADS, 0, stream>>>((uint16_t *)x, n, factor);
    else
        scale_f32_kernel<<<blocks, MT_CUDA_THREADS, 0, stream>>>((float *)x, n, factor);
    return cudaGetLastError();
}
