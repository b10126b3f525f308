/* Casts between f32 and bf16 on the CPU device (mt_op_cast, mt_op_accumulate), with the rounding
 * rule every other bf16 conversion shares (core/bf16_inline.h, the public mt_*_array). */
#include "core/bf16_inline.h"
#include "core/cpu/ops_cpu.h"

#include <string.h>

mt_status mt_cpu_op_cast(const void *src, mt_dtype src_dtype, void *dst, mt_dtype dst_dtype,
                         size_t n) {
    if (src_dtype == dst_dtype) {
        if (n) memmove(dst, src, n * mt_dtype_size(src_dtype));
        return MT_OK;
    }
    if (src_dtype == MT_F32) mt_f32_to_bf16_array(src, dst, n);
    else mt_bf16_to_f32_array(src, dst, n);
    return MT_OK;
}

mt_status mt_cpu_op_accumulate(float *dst, const void *src, mt_dtype src_dtype, size_t n) {
    if (src_dtype == MT_F32) {
        const float *s = src;
        for (size_t i = 0; i < n; i++) dst[i] += s[i];
    } else {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] += mt_bf16_widen(s[i]);
    }
    return MT_OK;
}
