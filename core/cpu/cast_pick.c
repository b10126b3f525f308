/* Which build of the f32 <-> bf16 conversions this CPU runs (core/cpu/cast_kernels.h). */
#include "core/cpu/cast_kernels.h"
#include "core/cpu/cpu_features.h"

#include <pthread.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static mt_cast_narrow_fn g_narrow = mt_cast_f32_to_bf16_generic;
static mt_cast_widen_fn g_widen = mt_cast_bf16_to_f32_generic;

static void pick(void) {
    if (mt_cpu_has(MT_CPU_AVX512F) && mt_cpu_has(MT_CPU_AVX512BW)) {
        g_narrow = mt_cast_f32_to_bf16_avx512;
        g_widen = mt_cast_bf16_to_f32_avx512;
    } else if (mt_cpu_has(MT_CPU_AVX2)) {
        g_narrow = mt_cast_f32_to_bf16_avx2;
        g_widen = mt_cast_bf16_to_f32_avx2;
    }
}

mt_cast_narrow_fn mt_cast_narrow_pick(void) {
    pthread_once(&g_once, pick);
    return g_narrow;
}

mt_cast_widen_fn mt_cast_widen_pick(void) {
    pthread_once(&g_once, pick);
    return g_widen;
}
