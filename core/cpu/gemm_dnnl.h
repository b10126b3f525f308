/* Internal: bf16 x bf16 -> f32 and f32 x f32 -> f32 matrix products on oneDNN (core/cpu/
 * gemm_dnnl.c), chosen for the CPU device's bf16 products by core/cpu/bf16_gemm_path.c and for its
 * f32 products by core/cpu/f32_gemm_path.c. */
#ifndef MT_CORE_CPU_GEMM_DNNL_H
#define MT_CORE_CPU_GEMM_DNNL_H

#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* C (m x n, f32, row-major) = alpha op(A) op(B) + beta C, A and B bf16 row-major (m x k, k x n,
 * or transposed), products accumulated in f32: cuBLAS GemmEx's CUBLAS_COMPUTE_32F up to the
 * summation order. m, n, k > 0. Blocks of C run on the rank's pool, cut by shape alone: the same
 * bits on any thread count. op names the caller in errors. */
mt_status mt_cpu_dnnl_gemm_bf16(const char *op, bool trans_a, bool trans_b, int m, int n, int k,
                                float alpha, const uint16_t *a, const uint16_t *b, float beta,
                                float *c);

/* The same with f32 A and B (oneDNN's f32 matmul), cut into blocks of at least min_block_macs
 * multiply-adds as the caller's own f32 products are. */
mt_status mt_cpu_dnnl_gemm_f32(const char *op, bool trans_a, bool trans_b, int m, int n, int k,
                               float alpha, const float *a, const float *b, float beta, float *c,
                               double min_block_macs);

/* How many primitives the process keeps (tests: a product run again makes none). */
size_t mt_cpu_dnnl_primitives(void);

/* Whether oneDNN's kernels may use bf16 instructions here (AVX512-BF16 or AMX): false on a CPU
 * without them and when ONEDNN_MAX_CPU_ISA caps oneDNN below them (it would emulate bf16, slower
 * than widening, or have no bf16 matmul at all). */
bool mt_cpu_dnnl_native_bf16(void);
/* Whether oneDNN's kernels here are AVX-512 ones (avx512_core or any later level). */
bool mt_cpu_dnnl_avx512(void);
/* Whether oneDNN's kernels here are its AMX ones (avx512_core_amx). */
bool mt_cpu_dnnl_amx(void);

/* The instruction set oneDNN's kernels use on this CPU (e.g. "avx512_core_bf16"), for messages. */
const char *mt_cpu_dnnl_isa_name(void);

#endif
