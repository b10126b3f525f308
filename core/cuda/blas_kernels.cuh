/* Internal (CUDA only): the kernels around cuBLAS products, defined in core/cuda/ops_blas.cu and
 * launched by the f32 and the bf16 products (ops_bf16.cu) alike. A __global__ function may be
 * launched from another translation unit through its declaration; only device functions would
 * need relocatable device code. */
#ifndef MT_CORE_CUDA_BLAS_KERNELS_CUH
#define MT_CORE_CUDA_BLAS_KERNELS_CUH

#include <stddef.h>

/* C = beta * C for an empty product (k = 0); beta = 0 gives 0 even where C held NaN. */
__global__ void gemm_beta_kernel(float *c, size_t n, float beta);
/* Every row of out (rows x cols) starts as the bias (or 0), so that the product adds onto it. */
__global__ void bias_rows_kernel(float *out, const float *bias, size_t rows, size_t cols);
/* d_bias[j] += column sums of g (rows x cols), rows in order as the CPU adds them. */
__global__ void bias_grad_kernel(float *d_bias, const float *g, size_t rows, size_t cols);

#endif
