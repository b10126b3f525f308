/* Test helpers for numeric comparisons, shared by the op, model and parallelism tests on the CPU
 * and on the GPU: small deterministic random generators, array copies, tolerance checks and the
 * largest relative error between two arrays. */
#ifndef MT_TESTS_NUMERIC_H
#define MT_TESTS_NUMERIC_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* xorshift64*: uniform in [0, 1), the same sequence on every machine for a given state. */
static inline double test_rand_unit(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (double)((*state * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

/* A 64-bit linear congruential step (Knuth's MMIX constants), uniform in [-1, 1). */
static inline double test_lcg_pm1(uint64_t *state) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* n floats amp * test_lcg_pm1(state); aborts when out of memory. The caller frees them. */
static inline float *test_lcg_floats(uint64_t *state, size_t n, double amp) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) abort();
    for (size_t i = 0; i < n; i++) v[i] = (float)(amp * test_lcg_pm1(state));
    return v;
}

/* The CPU sum of squares' order written plainly (core/cpu/sum_squares_vec.h, docs/cpu-kernels.md):
 * chunks of grain elements, each summed in 32 lanes (element i of a chunk into lane i mod 32),
 * the lanes folded in halves (lane l += lane l + w, w = 16, 8, 4, 2, 1), the chunk partials added
 * onto start in chunk order. */
static inline double test_chunked_sum_squares(double start, const float *x, size_t n,
                                              size_t grain) {
    double sum = start;
    for (size_t b = 0; b < n; b += grain) {
        size_t e = n - b < grain ? n : b + grain;
        double lane[32] = {0};
        for (size_t i = b; i < e; i++) lane[(i - b) % 32] += (double)x[i] * (double)x[i];
        for (size_t w = 16; w > 0; w /= 2)
            for (size_t l = 0; l < w; l++) lane[l] += lane[l + w];
        sum += lane[0];
    }
    return sum;
}

/* splitmix64's finalizer: a well-mixed hash of z, for values defined by a key (an index). */
static inline uint64_t test_mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* n pseudo-random bytes from seed (an LCG's high byte): copies checked bit-exact. */
static inline void test_fill_bytes(unsigned char *p, size_t n, unsigned seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (unsigned char)(x >> 24);
    }
}

/* A float's bits and back, for tests that compare exactly (NaN payloads, -0). */
static inline uint32_t test_f32_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static inline float test_f32_from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* A malloc'ed copy of n floats; aborts when out of memory. */
static inline float *test_copy_floats(const float *src, size_t n) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) abort();
    if (n) memcpy(v, src, n * sizeof *v);
    return v;
}

/* n floats widened to double (malloc'ed); aborts when out of memory. */
static inline double *test_to_double(const float *src, size_t n) {
    double *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) abort();
    for (size_t i = 0; i < n; i++) v[i] = src[i];
    return v;
}

/* |got - want| <= abs_tol + rel * |want| (false for NaN). */
static inline bool test_close_to(double got, double want, double rel, double abs_tol) {
    return fabs(got - want) <= abs_tol + rel * fabs(want);
}

/* n floats uniform in [lo, hi) from *state; aborts when out of memory. The caller frees them. */
static inline float *test_rand_floats(uint64_t *state, size_t n, float lo, float hi) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) abort();
    for (size_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * (float)test_rand_unit(state);
    return p;
}

/* Largest |got - want| / max(|want|, 1) over n elements; a NaN (in got or want) is the worst of
 * all: the result is NaN, which fails every `<= tol` check, and *at is its index. */
static inline double test_max_rel_err(const float *got, const float *want, size_t n, size_t *at) {
    double worst = 0.0;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double den = fabs((double)want[i]) > 1.0 ? fabs((double)want[i]) : 1.0;
        double e = fabs((double)got[i] - (double)want[i]) / den;
        if (isnan(e)) {
            *at = i;
            return e;
        }
        if (e > worst) {
            worst = e;
            *at = i;
        }
    }
    return worst;
}

#endif
