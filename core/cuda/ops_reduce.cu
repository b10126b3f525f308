/* The reductions of gradient clipping on a CUDA device (mt_op_sum_squares, mt_op_scale), queued
 * on the default stream like every other op; neither waits for the GPU.
 *
 * Sum of squares: each thread of a grid-stride loop sums its squares in double (the CPU sums in
 * double; FP64 costs little on the sm_80 / sm_90 GPUs this targets next to reading the floats),
 * the block reduces its threads' sums in double, and one thread per block adds the block's sum
 * into the double accumulator with atomicAdd (double atomics: sm_60 and later). The order of the
 * atomics varies from run to run, so the last bits of the result may too; a NaN or infinity in x
 * reaches the accumulator whatever the order. */
#include "core/cuda/ops_cuda.h"

/* At most this many blocks for the sum: a few per SM keep memory busy, and each block costs one
 * atomic on the same address, so more blocks would only queue more atomics. */
#define SUM_MAX_BLOCKS 1024u

__global__ void sum_squares_kernel(const float *x, size_t n, double *acc) {
    double s = 0.0;
    MT_GRID_STRIDE(i, n) {
        double g = (double)x[i];
        s += g * g;
    }
    s = mt_block_sum<double>(s); /* every thread of the block takes part: no early return above */
    if (threadIdx.x == 0) atomicAdd(acc, s);
}

__global__ void scale_kernel(float *x, float factor, size_t n) {
    MT_GRID_STRIDE(i, n) x[i] *= factor;
}

extern "C" mt_status mt_cuda_op_sum_squares(mt_device *dev, const float *x, size_t n,
                                            double *acc) {
    static const char *op = "sum_squares";
    if (n == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    unsigned blocks = mt_cuda_blocks(n, MT_CUDA_THREADS);
    if (blocks > SUM_MAX_BLOCKS) blocks = SUM_MAX_BLOCKS;
    sum_squares_kernel<<<blocks, MT_CUDA_THREADS>>>(x, n, acc);
    return mt_cuda_ops_launched(dev, op);
}

extern "C" mt_status mt_cuda_op_scale(mt_device *dev, float *x, float factor, size_t n) {
    static const char *op = "scale";
    if (n == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    scale_kernel<<<mt_cuda_blocks(n, MT_CUDA_THREADS), MT_CUDA_THREADS>>>(x, factor, n);
    return mt_cuda_ops_launched(dev, op);
}
