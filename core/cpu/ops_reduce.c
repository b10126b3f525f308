/* The reductions of gradient clipping on the CPU device (mt_op_sum_squares, mt_op_scale).
 * core/ops.c has checked the arguments. */
#include "core/cpu/ops_cpu.h"

/* One running double, read from *acc and written back once: element by element this is the sum
 * fsdp/clip.c formed before the op existed, in the same order, so CPU clipping keeps its bits. */
mt_status mt_cpu_op_sum_squares(const float *x, size_t n, double *acc) {
    double sum = *acc;
    for (size_t i = 0; i < n; i++) {
        double g = x[i];
        sum += g * g;
    }
    *acc = sum;
    return MT_OK;
}

mt_status mt_cpu_op_scale(float *x, float factor, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] *= factor;
    return MT_OK;
}
