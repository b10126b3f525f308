/* Internal: the CPU features the library's run-time choices depend on (the host AdamW's and GELU's
 * vector paths, the bf16 products' oneDNN path), asked in one place. */
#ifndef MT_CORE_CPU_CPU_FEATURES_H
#define MT_CORE_CPU_CPU_FEATURES_H

#include <stdbool.h>

typedef enum {
    MT_CPU_AVX2,
    MT_CPU_AVX512F,
    MT_CPU_AVX512BW,    /* byte and word lanes in AVX-512 registers (vpmovdw's narrowing) */
    MT_CPU_AVX512_BF16, /* bf16 dot products in AVX-512 registers (vdpbf16ps) */
    MT_CPU_AMX_BF16,    /* bf16 tile products (Sapphire Rapids and later) */
    MT_CPU_FEATURE_COUNT
} mt_cpu_feature;

/* Whether this CPU, its operating system (the wide registers' state saving) and this build (x86)
 * can run instructions of the feature. */
bool mt_cpu_has(mt_cpu_feature feature);

/* Whether the CPU is Intel's (CPUID vendor): where a choice rests on a measurement that differed
 * between vendors (core/cpu/bf16_gemm_path.c). */
bool mt_cpu_is_intel(void);

#endif
