/* The GELU kernels at 16 floats a vector (core/cpu/gelu_vec.h; flags in CMakeLists.txt). */
#include "core/cpu/gelu_kernels.h"

#define MT_GELU_WIDTH 16
#define MT_GELU_NAME avx512
#include "core/cpu/gelu_vec.h"
