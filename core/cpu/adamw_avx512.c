/* The AVX-512 AdamW kernel, 16 floats per step (core/cpu/adamw_vector.h), compiled with
 * -mavx512f and -ffp-contract=off (CMakeLists.txt); core/cpu/adamw_host.c only calls it on a CPU
 * with AVX-512. */
#include "core/cpu/adamw_host.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define ADAMW_VEC __m512
#define ADAMW_OP(name) _mm512_##name##_ps
#define ADAMW_LANES 16
#define ADAMW_KERNEL mt_adamw_kernel_avx512
#include "core/cpu/adamw_vector.h"
#else
/* Not an x86 build: mt_adamw_isa_supported() never selects this path. */
void mt_adamw_kernel_avx512(const mt_adamw_coeffs *k, float *param, const float *grad, float *m,
                            float *v, size_t n) {
    mt_adamw_kernel_scalar(k, param, grad, m, v, n);
}
#endif
