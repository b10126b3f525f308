/* The host AdamW's dispatch (core/cpu/adamw_host.h): the path by CPU features or MT_ADAMW_ISA,
 * and the split over the thread pool in fixed chunks (elementwise, so any split gives the same
 * bits; fixed chunks keep it so should a reduction, e.g. a fused norm, join it). */
#include "core/cpu/adamw_host.h"

#include "core/cpu/cpu_features.h"
#include "core/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef void (*adamw_kernel)(const mt_adamw_coeffs *, float *, const float *, float *, float *,
                             size_t);

static const char *const isa_names[MT_ADAMW_ISA_COUNT] = {"scalar", "avx2", "avx512"};

const char *mt_adamw_isa_name(mt_adamw_isa isa) {
    return (unsigned)isa < MT_ADAMW_ISA_COUNT ? isa_names[isa] : "unknown";
}

bool mt_adamw_isa_supported(mt_adamw_isa isa) {
    switch (isa) {
    case MT_ADAMW_SCALAR: return true;
    case MT_ADAMW_AVX2: return mt_cpu_has(MT_CPU_AVX2);
    case MT_ADAMW_AVX512: return mt_cpu_has(MT_CPU_AVX512F);
    default: return false;
    }
}

mt_status mt_adamw_isa_select(mt_adamw_isa *isa) {
    const char *want = getenv("MT_ADAMW_ISA");
    if (!want || !*want) {
        *isa = mt_adamw_isa_supported(MT_ADAMW_AVX512) ? MT_ADAMW_AVX512
               : mt_adamw_isa_supported(MT_ADAMW_AVX2) ? MT_ADAMW_AVX2
                                                       : MT_ADAMW_SCALAR;
        return MT_OK;
    }
    for (int i = 0; i < MT_ADAMW_ISA_COUNT; i++) {
        if (strcmp(want, isa_names[i]) != 0) continue;
        if (!mt_adamw_isa_supported((mt_adamw_isa)i))
            return mt_error(MT_ERR_UNSUPPORTED, "MT_ADAMW_ISA=%s: this CPU has no %s", want,
                            want);
        *isa = (mt_adamw_isa)i;
        return MT_OK;
    }
    return mt_error(MT_ERR_INVALID_ARG, "MT_ADAMW_ISA='%s': expected scalar, avx2 or avx512",
                    want);
}

void mt_adamw_coeffs_make(mt_adamw_coeffs *k, long t, float lr, float beta1, float beta2,
                          float eps, float weight_decay) {
    /* Bias corrections in double: beta2^t is close to 1 for many steps. */
    k->c1 = (float)(1.0 / (1.0 - pow((double)beta1, (double)t)));
    k->c2 = (float)(1.0 / (1.0 - pow((double)beta2, (double)t)));
    k->decay = lr * weight_decay;
    k->lr = lr;
    k->beta1 = beta1;
    k->beta2 = beta2;
    k->one_minus_beta1 = 1.0f - beta1;
    k->one_minus_beta2 = 1.0f - beta2;
    k->eps = eps;
    k->grad_scale = 1.0f;
}

typedef struct adamw_job {
    adamw_kernel kernel;
    const mt_adamw_coeffs *k;
    float *param, *m, *v;
    const float *grad;
} adamw_job;

static void adamw_chunk(void *ctx, size_t chunk, size_t begin, size_t end) {
    const adamw_job *j = ctx;
    j->kernel(j->k, j->param + begin, j->grad + begin, j->m + begin, j->v + begin, end - begin);
}

mt_status mt_host_adamw(mt_thread_pool *pool, mt_adamw_isa isa, float *param, const float *grad,
                        float *m, float *v, size_t n, long t, float lr, float beta1, float beta2,
                        float eps, float weight_decay) {
    return mt_host_adamw_scaled(pool, isa, param, grad, 1.0f, m, v, n, t, lr, beta1, beta2, eps,
                                weight_decay);
}

mt_status mt_host_adamw_scaled(mt_thread_pool *pool, mt_adamw_isa isa, float *param,
                               const float *grad, float grad_scale, float *m, float *v, size_t n,
                               long t, float lr, float beta1, float beta2, float eps,
                               float weight_decay) {
    static const adamw_kernel kernels[MT_ADAMW_ISA_COUNT] = {
        mt_adamw_kernel_scalar, mt_adamw_kernel_avx2, mt_adamw_kernel_avx512};
    if (!mt_adamw_isa_supported(isa))
        return mt_error(MT_ERR_UNSUPPORTED, "host adamw: the %s path needs a CPU with %s",
                        mt_adamw_isa_name(isa), mt_adamw_isa_name(isa));
    mt_adamw_coeffs k;
    mt_adamw_coeffs_make(&k, t, lr, beta1, beta2, eps, weight_decay);
    k.grad_scale = grad_scale;
    adamw_job job = {kernels[isa], &k, param, m, v, grad};
    if (!pool) {
        if (n) adamw_chunk(&job, 0, 0, n);
        return MT_OK;
    }
    return mt_parallel_for(pool, n, MT_ADAMW_GRAIN, adamw_chunk, &job);
}
