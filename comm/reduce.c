/* Reduction kernels. The bf16 rule comes inline from core/bf16_inline.h so that the hot loops
 * vectorize; CMakeLists.txt builds this file at -O3 (at -O2 GCC 12 vectorizes only loops whose
 * trip count is a known multiple of the vector width; these loops carry the whole cost of
 * reduce_scatter and all_reduce: about 20% of their bandwidth at 64 MiB, docs/benchmarks.md). */
#include "core/bf16_inline.h"
#include "comm/reduce.h"

#include <stdint.h>
#include <string.h>

static inline float combine(mt_reduce_op op, float x, float y) {
    if (op == MT_REDUCE_MAX) return x > y || x != x ? x : y;
    return x + y;
}

static void pair_f32(mt_reduce_op op, float scale, float *dst, const float *a, const float *b,
                     size_t n) {
    if (op == MT_REDUCE_MAX) {
        for (size_t i = 0; i < n; i++) dst[i] = combine(op, a[i], b[i]);
    } else if (scale != 1.0f) {
        for (size_t i = 0; i < n; i++) dst[i] = (a[i] + b[i]) / scale;
    } else {
        for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
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
        pair_f32(op, scale, dst, a, b, count);
    else
        pair_bf16(op, scale, dst, a, b, count);
}

/* Blocked so that the f32 accumulator stays in cache and dst may alias an input. */
#define MANY_BLOCK 1024

void mt_reduce_many(mt_dtype dtype, mt_reduce_op op, int ninputs, const void *const *inputs,
                    void *dst, size_t count) {
    float acc[MANY_BLOCK];
    float scale = op == MT_REDUCE_AVG ? (float)ninputs : 1.0f;
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
        if (dtype == MT_F32) memcpy((float *)dst + base, acc, n * sizeof *acc);
        else for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[base + i] = mt_bf16_round(acc[i]);
    }
}
