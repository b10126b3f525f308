/* Internal: the chunk kernel of mt_op_sum_squares on the CPU (core/cpu/ops_reduce.c), one build
 * per instruction set, all giving the same bits (core/cpu/sum_squares_vec.h). The host
 * reduce-scatter computes the same sums of its output as it writes it (comm/reduce.c), so that
 * gradient clipping need not read the gradient shard again (fsdp/clip.c). */
#ifndef MT_CORE_CPU_SUM_SQUARES_H
#define MT_CORE_CPU_SUM_SQUARES_H

#include "core/cpu/parallel.h"

#include <stddef.h>

/* The lanes of a chunk's sum: element k of the chunk is added into lane k mod MT_SQ_LANES. */
#define MT_SQ_LANES 32

/* mt_cpu_op_sum_squares sums [0, n) in chunks of this many elements from 0, one partial sum per
 * chunk, the partials added in chunk order (mt_sum_squares_add_partials). */
#define MT_SQ_CHUNK MT_CPU_ELEM_GRAIN

/* sum over the chunk of (double)x[k]^2, in the lane order above. */
double mt_sum_squares_chunk_generic(const float *x, size_t n);
double mt_sum_squares_chunk_avx2(const float *x, size_t n);
double mt_sum_squares_chunk_avx512(const float *x, size_t n);

/* The same additions, in pieces: adds x[k]^2 into lane[k mod MT_SQ_LANES]. A chunk fed in
 * several calls, each but the last a multiple of MT_SQ_LANES long, and then folded
 * (mt_sum_squares_fold) gives its chunk function's bits. */
void mt_sum_squares_lanes_generic(double lane[MT_SQ_LANES], const float *x, size_t n);
void mt_sum_squares_lanes_avx2(double lane[MT_SQ_LANES], const float *x, size_t n);
void mt_sum_squares_lanes_avx512(double lane[MT_SQ_LANES], const float *x, size_t n);

typedef double (*mt_sum_squares_chunk_fn)(const float *x, size_t n);
typedef void (*mt_sum_squares_lanes_fn)(double lane[MT_SQ_LANES], const float *x, size_t n);
/* The widest of the three the CPU runs. */
mt_sum_squares_chunk_fn mt_sum_squares_chunk_pick(void);
mt_sum_squares_lanes_fn mt_sum_squares_lanes_pick(void);

/* The lanes folded in halves (lane l += lane l + w for w = 16, 8, 4, 2, 1): the chunk's sum. */
static inline double mt_sum_squares_fold(double lane[MT_SQ_LANES]) {
    for (size_t w = MT_SQ_LANES / 2; w > 0; w /= 2)
        for (size_t l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

/* sum + partial[0] + partial[1] + ... in that order: how the chunks' sums are combined. */
static inline double mt_sum_squares_add_partials(double sum, const double *partial, size_t n) {
    for (size_t c = 0; c < n; c++) sum += partial[c];
    return sum;
}

#endif
