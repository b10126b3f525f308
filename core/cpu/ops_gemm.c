/* f32 matrix products on the CPU device (mt_op_gemm and the linears' products): OpenBLAS's
 * sgemm, called by the rank's pool on blocks of rows of C, with OpenBLAS itself on one thread
 * (core/thread_pool.c sets it so). Why: OpenBLAS's pthreads build keeps its own workers, which
 * spin-wait after every call beside the pool's threads, so a rank ran up to twice as many busy
 * threads as cores (docs/benchmarks.md, "CPU ops, round 2"). One set of threads does both now.
 *
 * Same bits on any thread count: OpenBLAS forms each element of C as the same sum over k in the
 * same order as long as the element sits in a tile of the same width (its k blocking depends on
 * k alone), so a block of rows that starts on a tile boundary gives the rows of the one-call
 * product. Blocks start at multiples of MT_CPU_GEMM_ROW_ALIGN (below), so that every row falls
 * in the kernel's tiles as in the one call. tests/core/test_cpu_ops_threads.c checks the blocks against one
 * single-threaded sgemm call, bit for bit, on 1, 2, 3 and 7 threads. */
#include "core/cpu/ops_cpu.h"

#include "core/cpu/parallel.h"

#include <cblas.h>

/* Blocks start at multiples of this many rows. The alignment matters: OpenBLAS's kernels sum an
 * element's k terms in an order that depends on the width of the tile of rows that holds it
 * (measured with OpenBLAS 0.3.21's Haswell sgemm, which it runs on this EPYC: a block boundary
 * at row 128 changed rows 120..199 of a 200-row product, while any multiple of 12 rows, its
 * widest tile, kept every bit). 48 is a multiple of 12, 16 and 24, the tile widths (3 x the
 * kernel's unroll) of the x86 sgemm kernels; test_cpu_ops_threads checks it on the machine. */
#define MT_CPU_GEMM_ROW_ALIGN ((size_t)48)
/* Below this many multiply-adds per block a hand-off costs more than it saves (a 2M-madd block
 * is some 20 us on one core; a hand-off a few). */
#define MT_CPU_GEMM_MIN_BLOCK_MACS ((double)(1 << 21))

static int max1(int x) { return x > 1 ? x : 1; }

typedef struct gemm_job {
    bool ta, tb;
    int n, k, lda, ldb;
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

mt_status mt_cpu_op_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                         const float *a, const float *b, float beta, float *c) {
    if (m == 0 || n == 0) return MT_OK;
    if (k == 0) {
        /* BLAS rejects a leading dimension of 0; the product is empty, only beta applies. */
        size_t total = (size_t)m * (size_t)n;
        for (size_t i = 0; i < total; i++) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
        return MT_OK;
    }
    gemm_job job = {trans_a, trans_b, n, k, trans_a ? m : k, trans_b ? k : n, alpha, beta,
                    a, b, c};
    mt_thread_pool *pool = NULL;
    MT_TRY(mt_thread_pool_get(&pool));
    /* One block per thread, aligned: the rows of C split evenly (which thread count does not
     * matter to the bits, see above). Small products stay one call. */
    size_t rows = (size_t)m, threads = (size_t)mt_thread_pool_threads(pool);
    size_t per = (rows + threads - 1) / threads;
    per = (per + MT_CPU_GEMM_ROW_ALIGN - 1) / MT_CPU_GEMM_ROW_ALIGN * MT_CPU_GEMM_ROW_ALIGN;
    if ((double)per * n * k < MT_CPU_GEMM_MIN_BLOCK_MACS) per = rows;
    if (per >= rows) {
        gemm_rows(&job, 0, 0, rows);
        return MT_OK;
    }
    return mt_cpu_parallel("gemm", rows, per, gemm_rows, &job);
}
