/* The reductions of gradient clipping on the CPU device (mt_op_sum_squares, mt_op_scale).
 * core/ops.c has checked the arguments. */
#include "core/cpu/adamw_host.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/parallel.h"
#include "core/cpu/sum_squares.h"
#include "core/error.h"

#include <stdlib.h>

typedef struct squares_job {
    const float *x;
    double *partial; /* one per chunk */
    mt_sum_squares_chunk_fn chunk_sum;
} squares_job;

static void squares_chunk(void *ctx, size_t chunk, size_t begin, size_t end) {
    const squares_job *j = ctx;
    j->partial[chunk] = j->chunk_sum(j->x + begin, end - begin);
}

/* The same check as the GELU and AdamW kernels' (core/cpu/adamw_host.c). */
static mt_adamw_isa widest_isa(void) {
    return mt_adamw_isa_supported(MT_ADAMW_AVX512) ? MT_ADAMW_AVX512
           : mt_adamw_isa_supported(MT_ADAMW_AVX2) ? MT_ADAMW_AVX2
                                                   : MT_ADAMW_SCALAR;
}

mt_sum_squares_chunk_fn mt_sum_squares_chunk_pick(void) {
    static const mt_sum_squares_chunk_fn by_isa[MT_ADAMW_ISA_COUNT] = {
        mt_sum_squares_chunk_generic, mt_sum_squares_chunk_avx2, mt_sum_squares_chunk_avx512};
    return by_isa[widest_isa()];
}

mt_sum_squares_lanes_fn mt_sum_squares_lanes_pick(void) {
    static const mt_sum_squares_lanes_fn by_isa[MT_ADAMW_ISA_COUNT] = {
        mt_sum_squares_lanes_generic, mt_sum_squares_lanes_avx2, mt_sum_squares_lanes_avx512};
    return by_isa[widest_isa()];
}

/* Gradient clipping's norm: fixed chunks of MT_SQ_CHUNK elements, each summed in lanes
 * (core/cpu/sum_squares_vec.h) on the pool, the partials added onto *acc in chunk order. The
 * chunks depend on n alone, so any thread count, and any TP rank, gets the same bits
 * (docs/cpu-kernels.md); they are not the bits of the one running double clipping used before
 * the op was split. */
mt_status mt_cpu_op_sum_squares(const float *x, size_t n, double *acc) {
    if (n == 0) return MT_OK;
    enum { STACK_CHUNKS = 256 };
    double stack[STACK_CHUNKS];
    size_t chunks = mt_parallel_chunks(n, MT_SQ_CHUNK);
    double *partial = chunks <= STACK_CHUNKS ? stack : malloc(chunks * sizeof *partial);
    if (!partial)
        return mt_error(MT_ERR_OUT_OF_MEMORY,
                        "sum_squares on the CPU: out of memory for %zu partial sums of %zu "
                        "elements", chunks, n);
    squares_job job = {x, partial, mt_sum_squares_chunk_pick()};
    mt_status st = mt_cpu_parallel("sum_squares", n, MT_SQ_CHUNK, squares_chunk, &job);
    if (st == MT_OK) *acc = mt_sum_squares_add_partials(*acc, partial, chunks);
    if (partial != stack) free(partial);
    return st;
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
