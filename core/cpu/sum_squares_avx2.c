/* The sum of squares of a chunk with AVX2 (core/cpu/sum_squares_vec.h). */
#include "core/cpu/sum_squares.h"

#define MT_SQ_NAME avx2
#include "core/cpu/sum_squares_vec.h"
