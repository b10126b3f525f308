/* Internal: the sum of squares of one chunk of floats (mt_op_sum_squares, gradient clipping),
 * written once and compiled once per instruction set (core/cpu/sum_squares_{generic,avx2,avx512}.c
 * define MT_SQ_NAME before including this file; flags in CMakeLists.txt).
 *
 * Element k of the chunk goes into double lane k mod MT_SQ_LANES; the lanes are then folded in
 * halves (lane l += lane l + w for w = 16, 8, 4, 2, 1). Each lane does the same IEEE double
 * operations in the same order at every width (no multiply-add contraction: -ffp-contract=off),
 * so every instruction set gives the same bits. 32 lanes, not fewer: each lane's additions form
 * one dependency chain, and at 8 lanes (one AVX-512 vector) the chain's latency, not memory,
 * bounded the loop (docs/cpu-kernels.md, "Sum of squares"). */
#include <stddef.h>

#define MT_SQ_CAT2(a, b) a##_##b
#define MT_SQ_CAT(a, b) MT_SQ_CAT2(a, b)

void MT_SQ_CAT(mt_sum_squares_lanes, MT_SQ_NAME)(double lane[MT_SQ_LANES], const float *x,
                                                size_t n) {
    size_t i = 0;
    for (; i + MT_SQ_LANES <= n; i += MT_SQ_LANES)
        for (size_t l = 0; l < MT_SQ_LANES; l++) {
            double g = x[i + l];
            lane[l] += g * g;
        }
    for (size_t l = 0; i < n; i++, l++) {
        double g = x[i];
        lane[l] += g * g;
    }
}

double MT_SQ_CAT(mt_sum_squares_chunk, MT_SQ_NAME)(const float *x, size_t n) {
    double lane[MT_SQ_LANES] = {0};
    MT_SQ_CAT(mt_sum_squares_lanes, MT_SQ_NAME)(lane, x, n);
    return mt_sum_squares_fold(lane);
}
