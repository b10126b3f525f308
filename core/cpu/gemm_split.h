/* Internal: how a CPU matrix product is cut into blocks of C for the rank's pool (core/cpu/
 * ops_gemm.c for f32, core/cpu/gemm_dnnl.c for bf16). The cut depends on the product's shape
 * alone, never on the thread count, so that every pool makes the same block calls on the same
 * operands and the bits do not depend on how many threads run them. */
#ifndef MT_CORE_CPU_GEMM_SPLIT_H
#define MT_CORE_CPU_GEMM_SPLIT_H

#include <stdbool.h>
#include <stddef.h>

/* A product is cut into at most this many blocks: enough to balance 2-8 threads, few enough that
 * repacking the other operand per block stays a small cost. */
#define MT_CPU_GEMM_MAX_BLOCKS ((size_t)8)

typedef struct mt_gemm_split {
    bool by_cols; /* blocks are ranges of C's columns (else of its rows) */
    size_t dim;   /* C's columns or rows */
    size_t per;   /* columns or rows per block; per >= dim: one block */
} mt_gemm_split;

/* The blocks of C = op(A) op(B) (m x n, inner size k, all > 0): ranges of the dimension whose
 * blocks repack the smaller operand, each of at least min_block_macs multiply-adds (what a
 * hand-off to a worker is worth for the kernel that runs them), at most MT_CPU_GEMM_MAX_BLOCKS,
 * sized in whole kernel tiles. */
mt_gemm_split mt_cpu_gemm_split(int m, int n, int k, double min_block_macs);

#endif
