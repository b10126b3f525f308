/* Internal: which kernel the CPU device's f32 matrix products run (core/cpu/ops_gemm.c): OpenBLAS's
 * sgemm or oneDNN's f32 matmul (core/cpu/gemm_dnnl.c), both on the rank's pool in blocks cut from
 * the shape alone. docs/cpu-kernels.md, "f32 products", says why and how it is chosen. */
#ifndef MT_CORE_CPU_F32_GEMM_PATH_H
#define MT_CORE_CPU_F32_GEMM_PATH_H

#include <meshtrain/status.h>

#include <stdbool.h>

typedef enum {
    MT_F32_GEMM_OPENBLAS, /* cblas_sgemm, OpenBLAS on one thread per block */
    MT_F32_GEMM_ONEDNN,   /* oneDNN's f32 matmul, one oneDNN thread per block */
} mt_f32_gemm_path;

/* Products smaller than this many multiply-adds stay on OpenBLAS on either path: a few
 * microseconds of work, where oneDNN's per-call costs (memory objects, the primitive's lookup)
 * and a new shape's primitive (a millisecond or more to create) are not repaid. */
#define MT_F32_GEMM_ONEDNN_MIN_MACS ((double)(1 << 20))

/* The process's path, chosen on the first call (printed once on stderr by the first call with
 * announce, which the products make): MT_CPU_F32_GEMM (onednn, openblas, or auto / unset) and,
 * for auto, the CPU: oneDNN on an Intel CPU whose oneDNN runs AVX-512 kernels (measured faster
 * in the GPT's step there), OpenBLAS elsewhere (not measured). A bad MT_CPU_F32_GEMM is
 * MT_ERR_INVALID_ARG, on every call. */
mt_status mt_cpu_f32_gemm_path(mt_f32_gemm_path *path, bool announce);

#endif
