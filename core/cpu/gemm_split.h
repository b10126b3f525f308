/* Internal: how a CPU matrix product is cut into blocks of C for the rank's pool (core/cpu/
 * ops_gemm.c for f32, core/cpu/gemm_dnnl.c for bf16). The cut depends on the product's shape
 * alone, never on the thread count, so that every pool makes the same block calls on the same
 * operands and the bits do not depend on how many threads run them. */
#ifndef MT_CORE_CPU_GEMM_SPLIT_H
#define MT_CORE_CPU_GEMM_SPLIT_H

#include <stddef.h>

/* A product is cut into at most this many blocks: enough to balance 2-8 threads, few enough that
 * repacking operands per block stays a small cost. */
#define MT_CPU_GEMM_MAX_BLOCKS ((size_t)8)

/* Each call on a block packs its rows of op(A) and its columns of op(B) again, so a grid of
 * row_blocks x col_blocks packs op(A) col_blocks times and op(B) row_blocks times. A block's rows
 * and columns are at least this many where the shape allows (dimensions of at least twice this
 * are halved): the repacked floats then stay under 1/768 of the block's multiply-adds per
 * operand. At 8 blocks of 384 columns, the GPT's 256 x 768 x 3072 products spent 6-11% more
 * time than at 4 of 768 (1 and 2 threads; docs/benchmarks.md, "Fewer, wider product blocks"). */
#define MT_CPU_GEMM_MIN_SPAN ((size_t)768)

typedef struct mt_gemm_split {
    size_t row_blocks, col_blocks; /* C is cut into row_blocks x col_blocks blocks */
    size_t rows_per, cols_per;     /* per block; the last row and column of blocks may be short */
} mt_gemm_split;

/* The blocks of C = op(A) op(B) (m x n, inner size k, all > 0): as many as the work allows at
 * min_block_macs multiply-adds each (what a hand-off to a worker is worth for the kernel that
 * runs them) and the spans at MT_CPU_GEMM_MIN_SPAN, but two wherever the work allows two;
 * a power of two in each dimension, at most MT_CPU_GEMM_MAX_BLOCKS in all, sized in whole kernel
 * tiles. */
mt_gemm_split mt_cpu_gemm_split(int m, int n, int k, double min_block_macs);

/* Block i's (0 <= i < row_blocks * col_blocks, row-major over the grid) rows [r0, r1) and
 * columns [c0, c1) of an m x n product. */
void mt_cpu_gemm_block(const mt_gemm_split *sp, int m, int n, size_t i, size_t *r0, size_t *r1,
                       size_t *c0, size_t *c1);

#endif
