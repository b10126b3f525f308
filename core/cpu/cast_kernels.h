/* Internal: the f32 <-> bf16 array conversions (the public mt_f32_to_bf16_array and
 * mt_bf16_to_f32_array, core/dtype.c, and so mt_op_cast on the CPU), one build per instruction
 * set, all giving the bits of core/bf16_inline.h's scalar rules (core/cpu/cast_vec.h). */
#ifndef MT_CORE_CPU_CAST_KERNELS_H
#define MT_CORE_CPU_CAST_KERNELS_H

#include <stddef.h>
#include <stdint.h>

void mt_cast_f32_to_bf16_generic(const float *src, uint16_t *dst, size_t n);
void mt_cast_f32_to_bf16_avx2(const float *src, uint16_t *dst, size_t n);
void mt_cast_f32_to_bf16_avx512(const float *src, uint16_t *dst, size_t n);
void mt_cast_bf16_to_f32_generic(const uint16_t *src, float *dst, size_t n);
void mt_cast_bf16_to_f32_avx2(const uint16_t *src, float *dst, size_t n);
void mt_cast_bf16_to_f32_avx512(const uint16_t *src, float *dst, size_t n);

typedef void (*mt_cast_narrow_fn)(const float *src, uint16_t *dst, size_t n);
typedef void (*mt_cast_widen_fn)(const uint16_t *src, float *dst, size_t n);

/* The widest build this CPU runs: avx512 (AVX-512 F and BW), avx2, else generic; decided once. */
mt_cast_narrow_fn mt_cast_narrow_pick(void);
mt_cast_widen_fn mt_cast_widen_pick(void);

#endif
