/* Internal: which kernel the CPU device's bf16 products run (core/cpu/ops_bf16.c): oneDNN's bf16
 * matmul (core/cpu/gemm_dnnl.c) or the bf16 operands widened to f32 and multiplied with sgemm
 * (core/cpu/ops_gemm.c). docs/cpu-kernels.md, "bf16 products", says why and how it is chosen. */
#ifndef MT_CORE_CPU_BF16_GEMM_PATH_H
#define MT_CORE_CPU_BF16_GEMM_PATH_H

#include <meshtrain/status.h>

#include <stdbool.h>

typedef enum {
    MT_BF16_GEMM_F32,    /* widened to f32, sgemm */
    MT_BF16_GEMM_ONEDNN, /* oneDNN bf16 matmul, f32 accumulation */
} mt_bf16_gemm_path;

/* The process's path, chosen on the first call (printed once on stderr by the first call with
 * announce, which the products make; the memory prediction asks without): MT_CPU_BF16_GEMM
 * (onednn, f32, or auto / unset) and, for auto, the CPU: oneDNN where it has AVX512-BF16 or AMX
 * (measured faster there) except an Intel CPU whose oneDNN lacks AMX (measured slower), f32
 * elsewhere. A bad MT_CPU_BF16_GEMM is MT_ERR_INVALID_ARG, on every
 * call. */
mt_status mt_cpu_bf16_gemm_path(mt_bf16_gemm_path *path, bool announce);

#endif
