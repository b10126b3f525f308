/* Internal: the GELU and exp kernels per vector width (core/cpu/gelu_vec.h), all giving the same
 * bits; core/cpu/ops_gelu.c picks the widest the CPU runs. forward: out = gelu(in); backward:
 * d_in += gelu'(in) * d_out, or with overwrite d_in = 0 + gelu'(in) * d_out (d_in not read). */
#ifndef MT_CORE_CPU_GELU_KERNELS_H
#define MT_CORE_CPU_GELU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>

void mt_gelu_forward_generic(const float *in, float *out, size_t n);
void mt_gelu_backward_generic(const float *in, const float *d_out, float *d_in, size_t n,
                              bool overwrite);
void mt_gelu_forward_avx2(const float *in, float *out, size_t n);
void mt_gelu_backward_avx2(const float *in, const float *d_out, float *d_in, size_t n,
                           bool overwrite);
void mt_gelu_forward_avx512(const float *in, float *out, size_t n);
void mt_gelu_backward_avx512(const float *in, const float *d_out, float *d_in, size_t n,
                             bool overwrite);

/* out[i] = exp(x[i] - shift), every x[i] <= shift (in place allowed); same bits at every width. */
void mt_exp_shift_generic(const float *x, float shift, float *out, size_t n);
void mt_exp_shift_avx2(const float *x, float shift, float *out, size_t n);
void mt_exp_shift_avx512(const float *x, float shift, float *out, size_t n);
/* The widest of the three the CPU runs. */
typedef void (*mt_exp_shift_fn)(const float *x, float shift, float *out, size_t n);
mt_exp_shift_fn mt_exp_shift_pick(void);

#endif
