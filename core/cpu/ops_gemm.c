/* f32 matrix products on the CPU device (mt_op_gemm and the linears' products): OpenBLAS's
 * sgemm, called by the rank's pool on blocks of C, with OpenBLAS itself on one thread
 * (core/thread_pool.c sets it so), or, where core/cpu/f32_gemm_path.h chooses it, oneDNN's f32
 * matmul on the same blocks (core/cpu/gemm_dnnl.c; products under MT_F32_GEMM_ONEDNN_MIN_MACS
 * stay on OpenBLAS). Why OpenBLAS at one thread: OpenBLAS's pthreads build keeps its own
 * workers, which spin-wait after every call beside the pool's threads, so a rank ran up to twice
 * as many busy threads as cores (docs/benchmarks.md, "CPU ops, round 2"); and OpenBLAS's own
 * split of a product over its threads changes the bits with the thread count (tests/core/
 * test_cpu_ops_threads.c saw it with OpenBLAS 0.3.21 on 2, 3 and 7 threads).
 *
 * Same bits on any thread count, by construction: the blocks are cut from the product's shape
 * alone, never from the thread count, so every pool makes the same sgemm calls on the same
 * operands; which thread runs a block does not matter. The blocks are a grid over C's rows and
 * columns, each call packing its rows of op(A) and its columns of op(B) again, so the grid is
 * kept coarse: spans of at least MT_CPU_GEMM_MIN_SPAN where the shape allows, at most
 * MT_CPU_GEMM_MAX_BLOCKS blocks, each of at least MT_CPU_GEMM_MIN_BLOCK_MACS multiply-adds
 * (core/cpu/gemm_split.h; the bf16 products on oneDNN, core/cpu/gemm_dnnl.c, cut the same way
 * with their own minimum). */
#include "core/cpu/ops_cpu.h"

#include "core/cpu/f32_gemm_path.h"
#include "core/cpu/gemm_dnnl.h"
#include "core/cpu/gemm_split.h"
#include "core/cpu/parallel.h"

#include <cblas.h>

/* A block is at least this many multiply-adds: some 20-40 us of sgemm on one core; a hand-off
 * to a worker is a few. */
#define MT_CPU_GEMM_MIN_BLOCK_MACS ((double)(1 << 22))

static int max1(int x) { return x > 1 ? x : 1; }

typedef struct gemm_job {
    bool ta, tb;
    int m, n, k, lda, ldb;
    float alpha, beta;
    const float *a, *b;
    float *c;
    mt_gemm_split split;
} gemm_job;

/* Block `chunk` of C (core/cpu/gemm_split.h): its rows of op(A) against its columns of op(B). */
static void gemm_block(void *ctx, size_t chunk, size_t begin, size_t end) {
    const gemm_job *j = ctx;
    size_t r0, r1, c0, c1;
    mt_cpu_gemm_block(&j->split, j->m, j->n, chunk, &r0, &r1, &c0, &c1);
    /* op(A) row r is row r of A, or column r of A when transposed (lda = m then); op(B) column c
     * is column c of B, or row c of B when transposed (ldb = k then). */
    const float *a = j->ta ? j->a + r0 : j->a + r0 * (size_t)j->lda;
    const float *b = j->tb ? j->b + c0 * (size_t)j->ldb : j->b + c0;
    cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans,
                j->tb ? CblasTrans : CblasNoTrans, (int)(r1 - r0), (int)(c1 - c0), j->k, j->alpha,
                a, max1(j->lda), b, max1(j->ldb), j->beta, j->c + r0 * (size_t)j->n + c0,
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
    mt_f32_gemm_path path;
    MT_TRY(mt_cpu_f32_gemm_path(&path, true));
    if (path == MT_F32_GEMM_ONEDNN &&
        (double)m * (double)n * (double)k >= MT_F32_GEMM_ONEDNN_MIN_MACS)
        return mt_cpu_dnnl_gemm_f32("gemm", trans_a, trans_b, m, n, k, alpha, a, b, beta, c,
                                    MT_CPU_GEMM_MIN_BLOCK_MACS);
    /* The pool first, even for one block: creating it sets OpenBLAS to one thread, without
     * which a one-block product would run on OpenBLAS's own threads and their bits. */
    mt_thread_pool *pool = NULL;
    MT_TRY(mt_thread_pool_get(&pool));
    gemm_job job = {trans_a, trans_b, m, n, k, trans_a ? m : k, trans_b ? k : n, alpha, beta,
                    a, b, c, mt_cpu_gemm_split(m, n, k, MT_CPU_GEMM_MIN_BLOCK_MACS)};
    size_t blocks = job.split.row_blocks * job.split.col_blocks;
    if (blocks == 1) {
        gemm_block(&job, 0, 0, 1);
        return MT_OK;
    }
    return mt_cpu_parallel("gemm", blocks, 1, gemm_block, &job);
}

