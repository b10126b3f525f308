/* Internal: the chunk kernel of mt_op_sum_squares on the CPU (core/cpu/ops_reduce.c), one build
 * per instruction set, all giving the same bits (core/cpu/sum_squares_vec.h). */
#ifndef MT_CORE_CPU_SUM_SQUARES_H
#define MT_CORE_CPU_SUM_SQUARES_H

#include <stddef.h>

/* The lanes of a chunk's sum: element k of the chunk is added into lane k mod MT_SQ_LANES. */
#define MT_SQ_LANES 32

/* sum over the chunk of (double)x[k]^2, in the lane order above. */
double mt_sum_squares_chunk_generic(const float *x, size_t n);
double mt_sum_squares_chunk_avx2(const float *x, size_t n);
double mt_sum_squares_chunk_avx512(const float *x, size_t n);

typedef double (*mt_sum_squares_chunk_fn)(const float *x, size_t n);
/* The widest of the three the CPU runs. */
mt_sum_squares_chunk_fn mt_sum_squares_chunk_pick(void);

#endif
