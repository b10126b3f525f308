/* The f32 <-> bf16 conversions, avx512 build (core/cpu/cast_vec.h). */
#include "core/cpu/cast_kernels.h"

#define MT_CAST_NAME avx512
#include "core/cpu/cast_vec.h"
