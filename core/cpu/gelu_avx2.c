/* The GELU kernels at 8 floats a vector (core/cpu/gelu_vec.h; flags in CMakeLists.txt). */
#include "core/cpu/gelu_kernels.h"

#define MT_GELU_WIDTH 8
#define MT_GELU_NAME avx2
#include "core/cpu/gelu_vec.h"
