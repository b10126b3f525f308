/* The f32 <-> bf16 conversions, generic build (core/cpu/cast_vec.h). */
#include "core/cpu/cast_kernels.h"

#define MT_CAST_NAME generic
#include "core/cpu/cast_vec.h"
