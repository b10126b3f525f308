/* Element types and f32 <-> bf16 conversion. bf16 is the upper half of a binary32, so widening is
 * a shift and narrowing is a rounding of the lower 16 bits. */
#include "core/bf16_inline.h"
#include "core/cpu/cast_kernels.h"
#include "core/error.h"

#include <meshtrain/dtype.h>

#include <string.h>
#include <strings.h>

size_t mt_dtype_size(mt_dtype dtype) {
    switch (dtype) {
    case MT_F32: return 4;
    case MT_BF16: return 2;
    case MT_DTYPE_COUNT: break;
    }
    return 0;
}

const char *mt_dtype_name(mt_dtype dtype) {
    switch (dtype) {
    case MT_F32: return "f32";
    case MT_BF16: return "bf16";
    case MT_DTYPE_COUNT: break;
    }
    return "invalid";
}

mt_status mt_dtype_parse(const char *name, mt_dtype *out) {
    if (!name || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_dtype_parse: name and out must not be NULL");
    if (!strcasecmp(name, "f32") || !strcasecmp(name, "float32") || !strcasecmp(name, "float")) {
        *out = MT_F32;
        return MT_OK;
    }
    if (!strcasecmp(name, "bf16") || !strcasecmp(name, "bfloat16")) {
        *out = MT_BF16;
        return MT_OK;
    }
    return mt_error(MT_ERR_INVALID_ARG,
                    "unknown dtype \"%s\" (expected f32, float32, float, bf16 or bfloat16)", name);
}

mt_bf16 mt_f32_to_bf16(float value) { return mt_bf16_round(value); }

float mt_bf16_to_f32(mt_bf16 value) { return mt_bf16_widen(value); }

/* The arrays: the widest build of the same rules this CPU runs (core/cpu/cast_vec.h). */
void mt_f32_to_bf16_array(const float *src, mt_bf16 *dst, size_t count) {
    mt_cast_narrow_pick()(src, dst, count);
}

void mt_bf16_to_f32_array(const mt_bf16 *src, float *dst, size_t count) {
    mt_cast_widen_pick()(src, dst, count);
}
