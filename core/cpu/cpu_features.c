/* The CPU feature checks (core/cpu/cpu_features.h), through libgcc's CPU model, which reads CPUID
 * once per process and includes the operating system's support of the wide registers (XGETBV). */
#include "core/cpu/cpu_features.h"

bool mt_cpu_has(mt_cpu_feature feature) {
    switch (feature) {
#if defined(__x86_64__) || defined(__i386__)
    case MT_CPU_AVX2: return __builtin_cpu_supports("avx2");
    case MT_CPU_AVX512F: return __builtin_cpu_supports("avx512f");
    case MT_CPU_AVX512BW: return __builtin_cpu_supports("avx512bw");
    case MT_CPU_AVX512_BF16: return __builtin_cpu_supports("avx512bf16");
    case MT_CPU_AMX_BF16: return __builtin_cpu_supports("amx-bf16");
#endif
    default: return false;
    }
}

bool mt_cpu_is_intel(void) {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_is("intel");
#else
    return false;
#endif
}
