/* Test helpers for numeric comparisons: a small deterministic random generator and the largest
 * relative error between two arrays, shared by the op tests on the CPU and on the GPU. */
#ifndef MT_TESTS_NUMERIC_H
#define MT_TESTS_NUMERIC_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* xorshift64*: uniform in [0, 1), the same sequence on every machine for a given state. */
static inline double test_rand_unit(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (double)((*state * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

/* Largest |got - want| / max(|want|, 1) over n elements, NaN counted as the worst; *at receives
 * its index. */
static inline double test_max_rel_err(const float *got, const float *want, size_t n, size_t *at) {
    double worst = 0.0;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double den = fabs((double)want[i]) > 1.0 ? fabs((double)want[i]) : 1.0;
        double e = fabs((double)got[i] - (double)want[i]) / den;
        if (!(e <= worst)) { /* also catches NaN */
            worst = e;
            *at = i;
        }
    }
    return worst;
}

#endif
