/* The AVX2 AdamW kernel, 8 floats per step (core/cpu/adamw_vector.h), compiled with -mavx2 and
 * -ffp-contract=off (CMakeLists.txt); core/cpu/adamw_host.c only calls it on a CPU with AVX2. */
#include "core/cpu/adamw_host.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define ADAMW_VEC __m256
#define ADAMW_OP(name) _mm256_##name##_ps
#define ADAMW_LANES 8
#define ADAMW_KERNEL mt_adamw_kernel_avx2
#include "core/cpu/adamw_vector.h"
#else
/* Not an x86 build: mt_adamw_isa_supported() never selects this path. */
void mt_adamw_kernel_avx2(const mt_adamw_coeffs *k, float *param, const float *grad, float *m,
                           float *v, size_t n) {
    mt_adamw_kernel_scalar(k, param, grad, m, v, n);
}
#endif
