/* f32 matrix products on the CPU device (mt_op_gemm and the linears' products): OpenBLAS's
 * sgemm, called by the rank's pool on blocks of C, with OpenBLAS itself on one thread
 * (core/thread_pool.c sets it so). Why: OpenBLAS's pthreads build keeps its own workers, which
 * spin-wait after every call beside the pool's threads, so a rank ran up to twice as many busy
 * threads as cores (docs/benchmarks.md, "CPU ops, round 2"); and OpenBLAS's own split of a
 * product over its threads changes the bits with the thread count (tests/core/
 * test_cpu_ops_threads.c saw it with OpenBLAS 0.3.21 on 2, 3 and 7 threads).
 *
 * Same bits on any thread count, by construction: the blocks are cut from the product's shape
 * alone, never from the thread count, so every pool makes the same sgemm calls on the same
 * operands; which thread runs a block does not matter. A block is a range of C's rows (each call
 * packs all of op(B) again) or of its columns (each call packs all of op(A) again), whichever
 * repacks the smaller operand; at most MT_CPU_GEMM_MAX_BLOCKS blocks, each of at least
 * MT_CPU_GEMM_MIN_BLOCK_MACS multiply-adds (core/cpu/gemm_split.h; the bf16 products on oneDNN,
 * core/cpu/gemm_dnnl.c, cut the same way with their own minimum). */
#include "core/cpu/ops_cpu.h"

#include "core/cpu/gemm_split.h"
#include "core/cpu/parallel.h"

#include <cblas.h>

/* A block is at least this many multiply-adds: some 20-40 us of sgemm on one core; a hand-off
 * to a worker is a few. */
#define MT_CPU_GEMM_MIN_BLOCK_MACS ((double)(1 << 22))
/* Block sizes are multiples of these (rows, columns): whole tiles of the sgemm kernels and whole
 * vectors, so that splitting costs no edge kernels in the middle of C. */
#define MT_CPU_GEMM_ROW_ALIGN ((size_t)48)
#define MT_CPU_GEMM_COL_ALIGN ((size_t)64)

static int max1(int x) { return x > 1 ? x : 1; }

typedef struct gemm_job {
    bool ta, tb;
    int m, n, k, lda, ldb;
    float alpha, beta;
    const float *a, *b;
    float *c;
} gemm_job;

/* Rows [begin, end) of C: the same rows of op(A) against all of op(B). */
static void gemm_rows(void *ctx, size_t chunk, size_t begin, size_t end) {
    const gemm_job *j = ctx;
    /* op(A) row r is row r of A, or column r of A when transposed (lda = m then). */
    const float *a = j->ta ? j->a + begin : j->a + begin * (size_t)j->lda;
    cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans,
                j->tb ? CblasTrans : CblasNoTrans, (int)(end - begin), j->n, j->k, j->alpha, a,
                max1(j->lda), j->b, max1(j->ldb), j->beta, j->c + begin * (size_t)j->n,
                max1(j->n));
}

/* Columns [begin, end) of C: all of op(A) against the same columns of op(B). */
static void gemm_cols(void *ctx, size_t chunk, size_t begin, size_t end) {
    const gemm_job *j = ctx;
    /* op(B) column c is column c of B, or row c of B when transposed (ldb = k then). */
    const float *b = j->tb ? j->b + begin * (size_t)j->ldb : j->b + begin;
    cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans,
                j->tb ? CblasTrans : CblasNoTrans, j->m, (int)(end - begin), j->k, j->alpha,
                j->a, max1(j->lda), b, max1(j->ldb), j->beta, j->c + begin, max1(j->n));
}

/* The block size along dim (rows or columns) from the shape alone: enough units for
 * min_macs multiply-adds, at most MT_CPU_GEMM_MAX_BLOCKS blocks, rounded up to align. */
static size_t block_units(size_t dim, double macs_per_unit, double min_macs, size_t align) {
    size_t per = (size_t)(min_macs / macs_per_unit) + 1;
    size_t cap = (dim + MT_CPU_GEMM_MAX_BLOCKS - 1) / MT_CPU_GEMM_MAX_BLOCKS;
    if (per < cap) per = cap;
    return (per + align - 1) / align * align;
}

mt_status mt_cpu_op_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                         const float *a, const float *b, float beta, float *c) {
    if (m == 0 || n == 0) return MT_OK;
    if (k == 0) {
        /* BLAS rejects a leading dimension of 0; the product is empty, only beta applies. */
        size_t total = (size_t)m * (size_t)n;
        for (size_t i = 0; i < total; i++) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
        return MT_OK;
    }
    /* The pool first, even for one block: creating it sets OpenBLAS to one thread, without
     * which a one-block product would run on OpenBLAS's own threads and their bits. */
    mt_thread_pool *pool = NULL;
    MT_TRY(mt_thread_pool_get(&pool));
    gemm_job job = {trans_a, trans_b, m, n, k, trans_a ? m : k, trans_b ? k : n, alpha, beta,
                    a, b, c};
    mt_gemm_split sp = mt_cpu_gemm_split(m, n, k, MT_CPU_GEMM_MIN_BLOCK_MACS);
    if (sp.per >= sp.dim) {
        gemm_rows(&job, 0, 0, (size_t)m);
        return MT_OK;
    }
    return mt_cpu_parallel("gemm", sp.dim, sp.per, sp.by_cols ? gemm_cols : gemm_rows, &job);
}

mt_gemm_split mt_cpu_gemm_split(int m, int n, int k, double min_block_macs) {
    /* Split the dimension whose blocks repack the smaller operand: rows repack op(B) (k x n),
     * columns op(A) (m x k). */
    mt_gemm_split sp;
    sp.by_cols = (double)m < (double)n;
    sp.dim = sp.by_cols ? (size_t)n : (size_t)m;
    double macs_per_unit = sp.by_cols ? (double)m * k : (double)n * k;
    sp.per = block_units(sp.dim, macs_per_unit, min_block_macs,
                         sp.by_cols ? MT_CPU_GEMM_COL_ALIGN : MT_CPU_GEMM_ROW_ALIGN);
    return sp;
}
