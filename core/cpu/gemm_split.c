/* Cutting a CPU matrix product into blocks of C (core/cpu/gemm_split.h). */
#include "core/cpu/gemm_split.h"

#include <stdbool.h>

/* Block spans are multiples of these (rows, columns): whole tiles of the product kernels and
 * whole vectors, so that splitting costs no edge kernels in the middle of C. */
#define ROW_ALIGN ((size_t)48)
#define COL_ALIGN ((size_t)64)

/* ceil(dim / blocks) rounded up to align, and how many blocks that makes. */
static size_t span_of(size_t dim, size_t *blocks, size_t align) {
    size_t per = (dim + *blocks - 1) / *blocks;
    per = (per + align - 1) / align * align;
    *blocks = (dim + per - 1) / per;
    return per;
}

mt_gemm_split mt_cpu_gemm_split(int m, int n, int k, double min_block_macs) {
    double by_work = (double)m * (double)n * (double)k / min_block_macs;
    size_t rb = 1, cb = 1, rows = (size_t)m, cols = (size_t)n;
    /* Halve the longer span while it stays at least MT_CPU_GEMM_MIN_SPAN and the work allows
     * twice the blocks. Halving columns repacks op(A) (m x k) once more per row of blocks,
     * halving rows op(B) (k x n) once more per column: the longer span is the cheaper to cut. */
    while ((double)(2 * rb * cb) <= by_work && 2 * rb * cb <= MT_CPU_GEMM_MAX_BLOCKS) {
        bool by_cols = cols / cb > rows / rb;
        size_t span = by_cols ? cols / cb : rows / rb;
        if (span < 2 * MT_CPU_GEMM_MIN_SPAN) break;
        if (by_cols) cb *= 2;
        else rb *= 2;
    }
    /* Two blocks wherever the work allows two, even if narrow: a pool of 2 or more threads
     * would otherwise leave all but one idle for the whole product, which costs more than a
     * second packing of one operand. */
    if (rb * cb == 1 && by_work >= 2.0) {
        if (cols > rows) cb = 2;
        else rb = 2;
    }
    mt_gemm_split sp;
    sp.row_blocks = rb, sp.col_blocks = cb;
    sp.rows_per = span_of(rows, &sp.row_blocks, ROW_ALIGN);
    sp.cols_per = span_of(cols, &sp.col_blocks, COL_ALIGN);
    return sp;
}

void mt_cpu_gemm_block(const mt_gemm_split *sp, int m, int n, size_t i, size_t *r0, size_t *r1,
                       size_t *c0, size_t *c1) {
    size_t row = i / sp->col_blocks, col = i % sp->col_blocks;
    *r0 = row * sp->rows_per;
    *r1 = *r0 + sp->rows_per < (size_t)m ? *r0 + sp->rows_per : (size_t)m;
    *c0 = col * sp->cols_per;
    *c1 = *c0 + sp->cols_per < (size_t)n ? *c0 + sp->cols_per : (size_t)n;
}
