/* Internal: the fused host AdamW, one pass over param, grad, m and v, multi-threaded over the
 * rank's thread pool (core/thread_pool.h) with one kernel per instruction set. It is the CPU
 * device's mt_op_adamw and the optimizer step of CPU offload, so both give the same bits.
 *
 * Every path computes exactly the formula and operation order of include/meshtrain/ops.h's
 * mt_op_adamw (and core/cuda's kernel): separate multiplies and adds (the files are compiled
 * with -ffp-contract=off, so no FMA contraction), a correctly rounded sqrt and a division (no
 * approximate rsqrt). Every path therefore gives the same bits, whatever the thread count. */
#ifndef MT_CORE_CPU_ADAMW_HOST_H
#define MT_CORE_CPU_ADAMW_HOST_H

#include "core/thread_pool.h"

#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

typedef enum { MT_ADAMW_SCALAR, MT_ADAMW_AVX2, MT_ADAMW_AVX512, MT_ADAMW_ISA_COUNT } mt_adamw_isa;

/* The step's constants, computed once per call. */
typedef struct mt_adamw_coeffs {
    float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, c1, c2, decay;
    /* The gradient the step reads is grad[i] * grad_scale, one rounding: a clipping factor
     * deferred to the step (fsdp/clip.c), so that the clip costs no pass of its own over the
     * gradients. 1 otherwise, which changes no bit (x * 1 is x). */
    float grad_scale;
} mt_adamw_coeffs;

/* Elements per chunk of the parallel-for: 32 KiB per array, enough to hide a hand-off. */
#define MT_ADAMW_GRAIN ((size_t)8192)

const char *mt_adamw_isa_name(mt_adamw_isa isa);
/* Whether this CPU (and this build) runs the path. Scalar always does. */
bool mt_adamw_isa_supported(mt_adamw_isa isa);
/* The best supported path, or MT_ADAMW_ISA (scalar, avx2, avx512) when set: an unknown name is
 * MT_ERR_INVALID_ARG, a path this CPU lacks MT_ERR_UNSUPPORTED. */
mt_status mt_adamw_isa_select(mt_adamw_isa *isa);

/* The step's constants: bias corrections in double, as mt_op_adamw has always computed them. */
void mt_adamw_coeffs_make(mt_adamw_coeffs *k, long t, float lr, float beta1, float beta2,
                          float eps, float weight_decay);

/* One AdamW step (mt_op_adamw's arguments) on host memory with the given path; pool NULL runs
 * on the calling thread. A path the CPU lacks is MT_ERR_UNSUPPORTED. */
mt_status mt_host_adamw(mt_thread_pool *pool, mt_adamw_isa isa, float *param, const float *grad,
                        float *m, float *v, size_t n, long t, float lr, float beta1, float beta2,
                        float eps, float weight_decay);
/* The same step on the gradient grad[i] * grad_scale (mt_adamw_coeffs.grad_scale): the bits of
 * mt_op_scale(grad, grad_scale) followed by mt_host_adamw, grad left as it is. */
mt_status mt_host_adamw_scaled(mt_thread_pool *pool, mt_adamw_isa isa, float *param,
                               const float *grad, float grad_scale, float *m, float *v, size_t n,
                               long t, float lr, float beta1, float beta2, float eps,
                               float weight_decay);

/* The kernels over [0, n), single-threaded; the vector ones finish their tail with the scalar
 * kernel. */
void mt_adamw_kernel_scalar(const mt_adamw_coeffs *k, float *param, const float *grad, float *m,
                            float *v, size_t n);
void mt_adamw_kernel_avx2(const mt_adamw_coeffs *k, float *param, const float *grad, float *m,
                          float *v, size_t n);
void mt_adamw_kernel_avx512(const mt_adamw_coeffs *k, float *param, const float *grad, float *m,
                            float *v, size_t n);

#endif
