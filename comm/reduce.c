/* Reduction kernels. The f32 sums and averages are written with SSE2 (sum_block), or AVX-512
 * where the CPU has it (comm/reduce_avx512.c); the bf16 rule comes inline from
 * core/bf16_inline.h so that the other loops vectorize. CMakeLists.txt builds this file at -O3
 * (at -O2 GCC 12 vectorizes only loops whose trip count is a known multiple of the vector width;
 * these loops carry the whole cost of reduce_scatter and all_reduce: about 20% of their
 * bandwidth at 64 MiB, docs/benchmarks.md). A final f32 output can also give the sums of squares
 * of what it wrote (mt_reduce_squares, for gradient clipping). */
#include "core/bf16_inline.h"
#include "core/cpu/cpu_features.h"
#include "core/cpu/sum_squares.h"
#include "comm/reduce.h"
#include "comm/reduce_kernels.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Final outputs at least this large are written with non-temporal stores (as core/copy_stream.c's
 * copies are): a reduce-scatter's shard is read again only by a later pass (clipping, the
 * optimizer), so its lines need no read-for-ownership and should not evict the data the next
 * step uses. In the GPT step at 2 ranks this cut the communication thread's CPU time from 36 to
 * 29 ms a step (docs/benchmarks.md, "Streaming stores for the reductions' outputs"). Partial
 * sums a ring passes on (not final) stay ordinary stores: the next rank reads them at once. */
#define STREAM_MIN_BYTES ((size_t)256 << 10)

static bool stream_output(size_t bytes) { return bytes >= STREAM_MIN_BYTES; }

static inline float combine(mt_reduce_op op, float x, float y) {
    if (op == MT_REDUCE_MAX) return x > y || x != x ? x : y;
    return x + y;
}

/* Blocks of the f32 sums: the sums of squares take a block's values from a buffer in cache. */
#define MANY_BLOCK 1024
_Static_assert(MT_SQ_CHUNK % MANY_BLOCK == 0 && MANY_BLOCK % MT_SQ_LANES == 0,
               "a block of the reductions lies within one chunk of the sums of squares");

/* The sums of squares of one output as its blocks are written (mt_reduce_squares): the blocks
 * come in order, so each chunk's lanes see its elements in order, as the chunk kernel does. */
typedef struct squares_run {
    const mt_reduce_squares *sq; /* NULL: none asked */
    mt_sum_squares_lanes_fn lanes;
    double lane[MT_SQ_LANES];
} squares_run;

static void squares_begin(squares_run *r, const mt_reduce_squares *sq) {
    r->sq = sq && sq->count ? sq : NULL;
    if (!r->sq) return;
    r->lanes = mt_sum_squares_lanes_pick();
    memset(r->lane, 0, sizeof r->lane);
}

/* How many of the block [at, at + n) of the output the sums of squares count. */
static size_t squares_in_block(const squares_run *r, size_t at, size_t n) {
    if (!r->sq || at >= r->sq->count) return 0;
    return r->sq->count - at < n ? r->sq->count - at : n;
}

/* After the lanes took the output up to element end: at a chunk's end, its partial sum. */
static void squares_fed(squares_run *r, size_t end) {
    if (end % MT_SQ_CHUNK == 0 || end == r->sq->count) {
        r->sq->partial[(end - 1) / MT_SQ_CHUNK] = mt_sum_squares_fold(r->lane);
        memset(r->lane, 0, sizeof r->lane);
    }
}

/* dst[i] = (in[0][at + i] + in[1][at + i] + ..., added in that order) / scale (no division when
 * scale is 1) for i < n, and the same into copy when given. With SSE2, sixteen at a time: one
 * cache line of every input per step, so that the prefetchers follow all k streams at once
 * (summing a block of one input after another, as this did before, ran at 0.6x the speed at 4
 * inputs: docs/benchmarks.md, "One pass over every input"). stream: non-temporal stores (dst
 * 16-byte aligned). dst may be an input's own elements: each step reads before it writes. */
static void sum_block(const float *const *in, int k, size_t at, float scale, float *dst,
                      float *copy, size_t n, bool stream) {
    size_t i = 0;
#if defined(__SSE2__)
    __m128 sv = _mm_set1_ps(scale);
    for (; i + 16 <= n; i += 16) {
        const float *x = in[0] + at + i;
        __m128 v0 = _mm_loadu_ps(x), v1 = _mm_loadu_ps(x + 4), v2 = _mm_loadu_ps(x + 8),
               v3 = _mm_loadu_ps(x + 12);
        for (int j = 1; j < k; j++) {
            x = in[j] + at + i;
            v0 = _mm_add_ps(v0, _mm_loadu_ps(x));
            v1 = _mm_add_ps(v1, _mm_loadu_ps(x + 4));
            v2 = _mm_add_ps(v2, _mm_loadu_ps(x + 8));
            v3 = _mm_add_ps(v3, _mm_loadu_ps(x + 12));
        }
        if (scale != 1.0f) {
            v0 = _mm_div_ps(v0, sv);
            v1 = _mm_div_ps(v1, sv);
            v2 = _mm_div_ps(v2, sv);
            v3 = _mm_div_ps(v3, sv);
        }
        if (stream) {
            _mm_stream_ps(dst + i, v0);
            _mm_stream_ps(dst + i + 4, v1);
            _mm_stream_ps(dst + i + 8, v2);
            _mm_stream_ps(dst + i + 12, v3);
        } else {
            _mm_storeu_ps(dst + i, v0);
            _mm_storeu_ps(dst + i + 4, v1);
            _mm_storeu_ps(dst + i + 8, v2);
            _mm_storeu_ps(dst + i + 12, v3);
        }
        if (copy) {
            _mm_storeu_ps(copy + i, v0);
            _mm_storeu_ps(copy + i + 4, v1);
            _mm_storeu_ps(copy + i + 8, v2);
            _mm_storeu_ps(copy + i + 12, v3);
        }
    }
#else
    (void)stream;
#endif
    for (; i < n; i++) {
        float v = in[0][at + i];
        for (int j = 1; j < k; j++) v += in[j][at + i];
        if (scale != 1.0f) v /= scale;
        dst[i] = v;
        if (copy) copy[i] = v;
    }
}

/* The AVX-512 kernel (comm/reduce_kernels.h) where the CPU has it; tests turn it off to run the
 * other path (mt_reduce_use_avx512). */
static atomic_int g_avx512 = -1; /* -1: as the CPU allows */

void mt_reduce_use_avx512(int on) { atomic_store(&g_avx512, on); }

/* x86 builds compile the kernel with its flags (CMakeLists.txt); elsewhere it is not there. */
#if defined(__x86_64__) || defined(__i386__)
#define HAVE_AVX512_KERNEL 1
#else
#define HAVE_AVX512_KERNEL 0
#endif

static bool avx512(void) {
#if HAVE_AVX512_KERNEL
    int on = atomic_load_explicit(&g_avx512, memory_order_relaxed);
    return on < 0 ? mt_cpu_has(MT_CPU_AVX512F) : on > 0 && mt_cpu_has(MT_CPU_AVX512F);
#else
    return false;
#endif
}

/* The f32 sum of k inputs into dst, block by block, taking sq's sums of squares: with AVX-512
 * from the registers (a block the squares count only in part goes through sum_block), else
 * from a copy of each block in cache (sum_block); non-temporal stores where stream and dst
 * allow, one fence after the last. */
static void sum_f32(const float *const *in, int k, float scale, float *dst, size_t count,
                    bool stream, const mt_reduce_squares *sq) {
    float block[MANY_BLOCK];
    squares_run squares;
    squares_begin(&squares, sq);
    /* The kernel streams to 64-byte lines only; the vectors of a chunk must start on its first
     * element for the lanes, so a misaligned output takes the 16-byte path instead. */
    bool wide = avx512() && (!stream || ((uintptr_t)dst & 63) == 0);
    (void)wide; /* without the kernel */
    bool stream_sse = stream && ((uintptr_t)dst & 15) == 0;
    for (size_t at = 0; at < count; at += MANY_BLOCK) {
        size_t n = count - at < MANY_BLOCK ? count - at : MANY_BLOCK;
        size_t nsq = squares_in_block(&squares, at, n);
#if HAVE_AVX512_KERNEL
        if (wide && (nsq == 0 || nsq == n)) {
            mt_reduce_sum_avx512(in, k, at, scale, dst + at, n, stream,
                                 nsq ? squares.lane : NULL);
            if (nsq) squares_fed(&squares, at + nsq);
            continue;
        }
#endif
        sum_block(in, k, at, scale, dst + at, nsq ? block : NULL, n, stream_sse);
        if (nsq) {
            squares.lanes(squares.lane, block, nsq);
            squares_fed(&squares, at + nsq);
        }
    }
#if defined(__SSE2__)
    /* Streaming stores are weakly ordered: visible before the peers are told. */
    if (stream) _mm_sfence();
#endif
}

static void pair_f32(mt_reduce_op op, float scale, bool final, float *dst, const float *a,
                     const float *b, size_t n) {
    if (op == MT_REDUCE_MAX) {
        for (size_t i = 0; i < n; i++) dst[i] = combine(op, a[i], b[i]);
        return;
    }
    sum_f32((const float *[]){a, b}, 2, scale, dst, n, final && stream_output(n * sizeof *dst),
            NULL);
}

static void pair_bf16(mt_reduce_op op, float scale, uint16_t *dst, const uint16_t *a,
                      const uint16_t *b, size_t n) {
    if (op == MT_REDUCE_MAX) {
        for (size_t i = 0; i < n; i++)
            dst[i] = mt_bf16_round(combine(op, mt_bf16_widen(a[i]), mt_bf16_widen(b[i])));
    } else if (scale != 1.0f) {
        for (size_t i = 0; i < n; i++)
            dst[i] = mt_bf16_round((mt_bf16_widen(a[i]) + mt_bf16_widen(b[i])) / scale);
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = mt_bf16_round(mt_bf16_widen(a[i]) + mt_bf16_widen(b[i]));
    }
}

void mt_reduce_pair(mt_dtype dtype, mt_reduce_op op, bool final, int group_size, void *dst,
                    const void *a, const void *b, size_t count) {
    float scale = final && op == MT_REDUCE_AVG ? (float)group_size : 1.0f;
    if (dtype == MT_F32)
        pair_f32(op, scale, final, dst, a, b, count);
    else
        pair_bf16(op, scale, dst, a, b, count);
}

void mt_reduce_squares_of(const float *x, const mt_reduce_squares *sq) {
    mt_sum_squares_chunk_fn chunk_sum = mt_sum_squares_chunk_pick();
    for (size_t at = 0; at < sq->count; at += MT_SQ_CHUNK)
        sq->partial[at / MT_SQ_CHUNK] =
            chunk_sum(x + at, sq->count - at < MT_SQ_CHUNK ? sq->count - at : MT_SQ_CHUNK);
}

void mt_reduce_many(mt_dtype dtype, mt_reduce_op op, int ninputs, const void *const *inputs,
                    void *dst, size_t count) {
    float scale = op == MT_REDUCE_AVG ? (float)ninputs : 1.0f;
    if (dtype == MT_F32 && op != MT_REDUCE_MAX) {
        sum_f32((const float *const *)inputs, ninputs, scale, dst, count,
                stream_output(count * sizeof(float)), NULL);
        return;
    }
    /* bf16, and max: blocked so that the f32 accumulator stays in cache. */
    float acc[MANY_BLOCK];
    for (size_t base = 0; base < count; base += MANY_BLOCK) {
        size_t n = count - base < MANY_BLOCK ? count - base : MANY_BLOCK;
        for (int j = 0; j < ninputs; j++) {
            if (dtype == MT_F32) {
                const float *in = (const float *)inputs[j] + base;
                if (j == 0) memcpy(acc, in, n * sizeof *acc);
                else for (size_t i = 0; i < n; i++) acc[i] = combine(op, acc[i], in[i]);
            } else {
                const uint16_t *in = (const uint16_t *)inputs[j] + base;
                if (j == 0)
                    for (size_t i = 0; i < n; i++) acc[i] = mt_bf16_widen(in[i]);
                else
                    for (size_t i = 0; i < n; i++)
                        acc[i] = combine(op, acc[i], mt_bf16_widen(in[i]));
            }
        }
        if (scale != 1.0f)
            for (size_t i = 0; i < n; i++) acc[i] /= scale;
        if (dtype == MT_F32) memcpy((float *)dst + base, acc, n * sizeof *acc);
        else for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[base + i] = mt_bf16_round(acc[i]);
    }
}

void mt_reduce_many_squares(mt_reduce_op op, int ninputs, const void *const *inputs, float *dst,
                            size_t count, const mt_reduce_squares *sq) {
    float scale = op == MT_REDUCE_AVG ? (float)ninputs : 1.0f;
    sum_f32((const float *const *)inputs, ninputs, scale, dst, count,
            stream_output(count * sizeof(float)), sq);
}

void mt_reduce_pair_squares(mt_reduce_op op, int group_size, float *dst, const float *a,
                            const float *b, size_t count, const mt_reduce_squares *sq) {
    float scale = op == MT_REDUCE_AVG ? (float)group_size : 1.0f;
    sum_f32((const float *[]){a, b}, 2, scale, dst, count,
            stream_output(count * sizeof(float)), sq);
}
