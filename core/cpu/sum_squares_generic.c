/* The sum of squares of a chunk with the baseline instruction set, SSE2 on x86-64
 * (core/cpu/sum_squares_vec.h). */
#include "core/cpu/sum_squares.h"

#define MT_SQ_NAME generic
#include "core/cpu/sum_squares_vec.h"
