/* Internal: the per-instruction-set kernels of comm/reduce.c. */
#ifndef MT_COMM_REDUCE_KERNELS_H
#define MT_COMM_REDUCE_KERNELS_H

#include <stdbool.h>
#include <stddef.h>

/* dst[i] = (in[0][at + i] + in[1][at + i] + ..., in that order) / scale (no division when scale
 * is 1) for i < n; stream: non-temporal stores where dst is 64-byte aligned (the caller fences).
 * lane (32 doubles, or NULL): adds the square of dst[i] into lane[i mod 32] (a chunk of the sums
 * of squares fed from its start, core/cpu/sum_squares.h). AVX-512F; x86-64 builds only. */
void mt_reduce_sum_avx512(const float *const *in, int k, size_t at, float scale, float *dst,
                          size_t n, bool stream, double *lane);

#endif
