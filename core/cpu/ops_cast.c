/* Casts between f32 and bf16 on the CPU device (mt_op_cast, mt_op_accumulate), with the rounding
 * rule every other bf16 conversion shares (core/bf16_inline.h, the public mt_*_array);
 * elementwise in fixed chunks over the rank's pool. */
#include "core/bf16_inline.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/parallel.h"

#include <string.h>

typedef struct cast_job {
    const void *src;
    void *dst;
    mt_dtype src_dtype;
} cast_job;

static void cast_chunk(void *ctx, size_t chunk, size_t begin, size_t end) {
    const cast_job *j = ctx;
    if (j->src_dtype == MT_F32)
        mt_f32_to_bf16_array((const float *)j->src + begin, (mt_bf16 *)j->dst + begin,
                             end - begin);
    else
        mt_bf16_to_f32_array((const mt_bf16 *)j->src + begin, (float *)j->dst + begin,
                             end - begin);
}

mt_status mt_cpu_op_cast(const void *src, mt_dtype src_dtype, void *dst, mt_dtype dst_dtype,
                         size_t n) {
    if (src_dtype == dst_dtype) {
        if (n) memmove(dst, src, n * mt_dtype_size(src_dtype));
        return MT_OK;
    }
    cast_job job = {src, dst, src_dtype};
    return mt_cpu_parallel("cast", n, MT_CPU_ELEM_GRAIN, cast_chunk, &job);
}

static void accumulate_chunk(void *ctx, size_t chunk, size_t begin, size_t end) {
    const cast_job *j = ctx;
    float *d = j->dst;
    if (j->src_dtype == MT_F32) {
        const float *s = j->src;
        for (size_t i = begin; i < end; i++) d[i] += s[i];
    } else {
        const uint16_t *s = j->src;
        for (size_t i = begin; i < end; i++) d[i] += mt_bf16_widen(s[i]);
    }
}

mt_status mt_cpu_op_accumulate(float *dst, const void *src, mt_dtype src_dtype, size_t n) {
    cast_job job = {src, dst, src_dtype};
    return mt_cpu_parallel("accumulate", n, MT_CPU_ELEM_GRAIN, accumulate_chunk, &job);
}
