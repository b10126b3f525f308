/* Element types: f32 and bf16 (the upper 16 bits of an IEEE-754 binary32).
 *
 * f32 -> bf16 rounds to nearest, ties to even; NaN stays NaN (quiet), infinities stay infinite,
 * denormals are kept (bf16 has the same exponent range as f32), overflow rounds to infinity.
 */
#ifndef MESHTRAIN_DTYPE_H
#define MESHTRAIN_DTYPE_H

#include <meshtrain/api.h>
#include <meshtrain/status.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_dtype { MT_F32 = 0, MT_BF16 = 1, MT_DTYPE_COUNT } mt_dtype;

typedef uint16_t mt_bf16;

/* Bytes per element (4 or 2); 0 for an invalid dtype. */
MT_API size_t mt_dtype_size(mt_dtype dtype);

/* "f32" or "bf16"; "invalid" otherwise. */
MT_API const char *mt_dtype_name(mt_dtype dtype);

/* Parses "f32"/"float32"/"float" or "bf16"/"bfloat16". */
MT_API mt_status mt_dtype_parse(const char *name, mt_dtype *out);

/* Scalar conversions. */
MT_API mt_bf16 mt_f32_to_bf16(float value);
MT_API float mt_bf16_to_f32(mt_bf16 value);

/* Array conversions; src and dst must not overlap. */
MT_API void mt_f32_to_bf16_array(const float *src, mt_bf16 *dst, size_t count);
MT_API void mt_bf16_to_f32_array(const mt_bf16 *src, float *dst, size_t count);

#ifdef __cplusplus
}
#endif
#endif
