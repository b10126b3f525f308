/* The CPU's f32 product path (core/cpu/f32_gemm_path.h): decided once per process. Why these
 * rules (docs/benchmarks.md, "f32 products on oneDNN"): on an Intel Xeon with AVX-512 and AMX
 * (oneDNN's avx512_core brgemm kernels for f32), the GPT's training step took 0.89 of its
 * OpenBLAS time at one rank of 2 threads and 0.81-0.83 at 2 and 4 ranks of one thread, although
 * the same products alone, their operands hot in the caches, ran within a few percent of
 * OpenBLAS's (some faster, the d_in products 25% slower). The likely reading, not measured apart:
 * in the step the operands come from memory, where OpenBLAS packs both of them (and zeroes C
 * before it adds into it) and oneDNN's kernels read A in place. Elsewhere (AMD, or AVX2 only)
 * nothing was measured: OpenBLAS, as before. */
#include "core/cpu/f32_gemm_path.h"

#include "core/cpu/cpu_features.h"
#include "core/cpu/gemm_dnnl.h"
#include "core/error.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static mt_f32_gemm_path g_path;
static const char *g_why; /* what decided it, for the message */
static char g_bad[64];     /* a bad MT_CPU_F32_GEMM, reported on every call */
static pthread_once_t g_told = PTHREAD_ONCE_INIT;

static void choose(void) {
    const char *want = getenv("MT_CPU_F32_GEMM");
    if (want && strcmp(want, "onednn") == 0) {
        g_path = MT_F32_GEMM_ONEDNN;
        g_why = "MT_CPU_F32_GEMM=onednn";
    } else if (want && strcmp(want, "openblas") == 0) {
        g_path = MT_F32_GEMM_OPENBLAS;
        g_why = "MT_CPU_F32_GEMM=openblas";
    } else if (!want || !*want || strcmp(want, "auto") == 0) {
        bool intel = mt_cpu_is_intel(), avx512 = mt_cpu_dnnl_avx512();
        g_path = intel && avx512 ? MT_F32_GEMM_ONEDNN : MT_F32_GEMM_OPENBLAS;
        g_why = !intel ? "not an Intel CPU: oneDNN not measured faster here"
                : !avx512 ? "oneDNN has no AVX-512 kernels here: not measured faster"
                          : "an Intel CPU with AVX-512: measured faster in training steps";
    } else {
        snprintf(g_bad, sizeof g_bad, "%s", want);
    }
}

/* The choice, on stderr: once, when the first f32 product runs. */
static void tell(void) {
    if (g_path == MT_F32_GEMM_ONEDNN)
        fprintf(stderr, "meshtrain: f32 products: oneDNN %s (%s)\n", mt_cpu_dnnl_isa_name(),
                g_why);
    else
        fprintf(stderr, "meshtrain: f32 products: OpenBLAS sgemm (%s)\n", g_why);
}

mt_status mt_cpu_f32_gemm_path(mt_f32_gemm_path *path, bool announce) {
    pthread_once(&g_once, choose);
    if (g_bad[0])
        return mt_error(MT_ERR_INVALID_ARG,
                        "MT_CPU_F32_GEMM='%s': expected onednn, openblas or auto (f32 products "
                        "on the CPU)",
                        g_bad);
    if (announce) pthread_once(&g_told, tell);
    *path = g_path;
    return MT_OK;
}
