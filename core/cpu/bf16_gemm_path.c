/* The CPU's bf16 product path (core/cpu/bf16_gemm_path.h): decided once per process. Why these
 * rules (docs/benchmarks.md, "bf16 products"; the GPT's ten linears summed, bf16 / f32 time):
 *  - AMX (oneDNN's avx512_core_amx, an Intel Xeon): 0.35. oneDNN.
 *  - AVX512-BF16 without AMX: on an AMD EPYC oneDNN's avx512_core_bf16 kernels took 0.31 (the
 *    widening 1.06): oneDNN. On an Intel Xeon whose oneDNN is held below AMX they took 1.41,
 *    the widening 1.15: widened. (Intel's bf16 dot product issues at half AMD's rate there.)
 *  - no bf16 instructions: oneDNN 2.6 emulates them on AVX-512 (1.4 times sgemm's time, where
 *    widening costs 1.06) and has no bf16 matmul at all below AVX-512 (primitive creation
 *    fails: unimplemented). Widened. */
#include "core/cpu/bf16_gemm_path.h"

#include "core/cpu/cpu_features.h"
#include "core/cpu/gemm_dnnl.h"
#include "core/error.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static mt_bf16_gemm_path g_path;
static const char *g_why; /* what decided it, for the message */
static char g_bad[64];     /* a bad MT_CPU_BF16_GEMM, reported on every call */
static pthread_once_t g_told = PTHREAD_ONCE_INIT;

static void choose(void) {
    const char *want = getenv("MT_CPU_BF16_GEMM");
    bool amx = mt_cpu_has(MT_CPU_AMX_BF16), avx512bf16 = mt_cpu_has(MT_CPU_AVX512_BF16);
    const char *why;
    if (want && strcmp(want, "onednn") == 0) {
        g_path = MT_BF16_GEMM_ONEDNN;
        why = "MT_CPU_BF16_GEMM=onednn";
    } else if (want && strcmp(want, "f32") == 0) {
        g_path = MT_BF16_GEMM_F32;
        why = "MT_CPU_BF16_GEMM=f32";
    } else if (!want || !*want || strcmp(want, "auto") == 0) {
        bool native = mt_cpu_dnnl_native_bf16(), dnnl_amx = mt_cpu_dnnl_amx();
        bool intel_no_amx = native && !dnnl_amx && mt_cpu_is_intel();
        g_path = (amx || avx512bf16) && native && !intel_no_amx ? MT_BF16_GEMM_ONEDNN
                                                                 : MT_BF16_GEMM_F32;
        why = !(amx || avx512bf16) ? "CPU has neither AVX512-BF16 nor AMX-BF16"
              : !native            ? "oneDNN is capped below its bf16 kernels (ONEDNN_MAX_CPU_ISA)"
              : intel_no_amx       ? "an Intel CPU whose oneDNN has AVX512-BF16 but not AMX: "
                                     "measured slower than widening"
              : dnnl_amx           ? "CPU has AMX-BF16"
                                   : "CPU has AVX512-BF16";
    } else {
        snprintf(g_bad, sizeof g_bad, "%s", want);
        return;
    }
    g_why = why;
}

/* The choice, on stderr: once, when the first bf16 product runs. */
static void tell(void) {
    if (g_path == MT_BF16_GEMM_ONEDNN)
        fprintf(stderr, "meshtrain: bf16 products: oneDNN %s (%s)\n", mt_cpu_dnnl_isa_name(),
                g_why);
    else
        fprintf(stderr, "meshtrain: bf16 products: widened to f32, the f32 products' path (%s)\n",
                g_why);
}

mt_status mt_cpu_bf16_gemm_path(mt_bf16_gemm_path *path, bool announce) {
    pthread_once(&g_once, choose);
    if (g_bad[0])
        return mt_error(MT_ERR_INVALID_ARG,
                        "MT_CPU_BF16_GEMM='%s': expected onednn, f32 or auto (bf16 products on "
                        "the CPU)",
                        g_bad);
    if (announce) pthread_once(&g_told, tell);
    *path = g_path;
    return MT_OK;
}
