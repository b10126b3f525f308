/* The reductions of gradient clipping on the CPU device (mt_op_sum_squares, mt_op_scale).
 * core/ops.c has checked the arguments. */
#include "core/cpu/ops_cpu.h"
#include "core/cpu/parallel.h"

/* One running double, read from *acc and written back once: element by element this is the sum
 * fsdp/clip.c formed before the op existed, in the same order, so CPU clipping keeps its bits
 * (hence not split over the pool: per-chunk partials would round differently). */
mt_status mt_cpu_op_sum_squares(const float *x, size_t n, double *acc) {
    double sum = *acc;
    for (size_t i = 0; i < n; i++) {
        double g = x[i];
        sum += g * g;
    }
    *acc = sum;
    return MT_OK;
}

typedef struct scale_job {
    float *x;
    float factor;
} scale_job;

static void scale_chunk(void *ctx, size_t chunk, size_t begin, size_t end) {
    const scale_job *j = ctx;
    for (size_t i = begin; i < end; i++) j->x[i] *= j->factor;
}

/* Elementwise, so split over the pool in fixed chunks (any split gives the same bits). */
mt_status mt_cpu_op_scale(float *x, float factor, size_t n) {
    scale_job job = {x, factor};
    return mt_cpu_parallel("scale", n, MT_CPU_ELEM_GRAIN, scale_chunk, &job);
}
