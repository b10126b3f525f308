/* Reduction kernels. The bf16 rule comes inline from core/bf16_inline.h so that the hot loops
 * vectorize; CMakeLists.txt builds this file at -O3 (at -O2 GCC 12 vectorizes only loops whose
 * trip count is a known multiple of the vector width; these loops carry the whole cost of
 * reduce_scatter and all_reduce: about 20% of their bandwidth at 64 MiB, docs/benchmarks.md). */
#include "core/bf16_inline.h"
#include "comm/reduce.h"

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

static void pair_f32(mt_reduce_op op, float scale, bool final, float *dst, const float *a,
                     const float *b, size_t n) {
    if (op == MT_REDUCE_MAX) {
        for (size_t i = 0; i < n; i++) dst[i] = combine(op, a[i], b[i]);
        return;
    }
    size_t i = 0;
#if defined(__SSE2__)
    if (final && stream_output(n * sizeof *dst)) {
        /* The same additions and division per element as the loops below, four at a time. */
        for (; i < n && ((uintptr_t)(dst + i) & 15); i++)
            dst[i] = scale != 1.0f ? (a[i] + b[i]) / scale : a[i] + b[i];
        __m128 sv = _mm_set1_ps(scale);
        for (; i + 4 <= n; i += 4) {
            __m128 v = _mm_add_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i));
            if (scale != 1.0f) v = _mm_div_ps(v, sv);
            _mm_stream_ps(dst + i, v);
        }
        /* Streaming stores are weakly ordered: visible before the peers are told. */
        _mm_sfence();
    }
#endif
    if (scale != 1.0f) {
        for (; i < n; i++) dst[i] = (a[i] + b[i]) / scale;
    } else {
        for (; i < n; i++) dst[i] = a[i] + b[i];
    }
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

/* n floats from a block to dst with non-temporal stores where the CPU has them (the caller
 * fences once after the last block). */
static void stream_block(float *dst, const float *src, size_t n) {
    size_t i = 0;
#if defined(__SSE2__)
    for (; i < n && ((uintptr_t)(dst + i) & 15); i++) dst[i] = src[i];
    for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
#endif
    for (; i < n; i++) dst[i] = src[i];
}

/* Blocked so that the f32 accumulator stays in cache and dst may alias an input. */
#define MANY_BLOCK 1024

void mt_reduce_many(mt_dtype dtype, mt_reduce_op op, int ninputs, const void *const *inputs,
                    void *dst, size_t count) {
    float acc[MANY_BLOCK];
    float scale = op == MT_REDUCE_AVG ? (float)ninputs : 1.0f;
    bool stream = dtype == MT_F32 && stream_output(count * sizeof(float));
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
                    for (size_t i = 0; i < n; i++) acc[i] = combine(op, acc[i], mt_bf16_widen(in[i]));
            }
        }
        if (scale != 1.0f)
            for (size_t i = 0; i < n; i++) acc[i] /= scale;
        if (dtype == MT_F32 && stream) stream_block((float *)dst + base, acc, n);
        else if (dtype == MT_F32) memcpy((float *)dst + base, acc, n * sizeof *acc);
        else for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[base + i] = mt_bf16_round(acc[i]);
    }
#if defined(__SSE2__)
    /* Streaming stores are weakly ordered: visible before the peers are told. */
    if (stream) _mm_sfence();
#endif
}
