/* The GELU kernels at 4 floats a vector (core/cpu/gelu_vec.h; flags in CMakeLists.txt). */
#include "core/cpu/gelu_kernels.h"

#define MT_GELU_WIDTH 4
#define MT_GELU_NAME generic
#include "core/cpu/gelu_vec.h"
