/* The f32 sum of the host reductions with AVX-512 (comm/reduce_kernels.h), built with -mavx512f
 * and -ffp-contract=off (CMakeLists.txt); comm/reduce.c calls it only where the CPU has AVX-512F.
 * Thirty-two elements a step: the inputs added in order, divided, stored; the squares of the
 * stored values go into the 32 double lanes from registers, element e of a chunk into lane
 * e mod 32 with one multiply and one add each, as the sum-of-squares chunk kernel does
 * (core/cpu/sum_squares_vec.h), so the partial sums have its bits. */
#include "comm/reduce_kernels.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#include <stdint.h>

static inline __m512d widen_low(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }

static inline __m512d widen_high(__m512 v) {
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

static inline __m512d add_square(__m512d lane, __m512d d) {
    return _mm512_add_pd(lane, _mm512_mul_pd(d, d));
}

void mt_reduce_sum_avx512(const float *const *in, int k, size_t at, float scale, float *dst,
                          size_t n, bool stream, double *lane) {
    stream = stream && ((uintptr_t)dst & 63) == 0;
    __m512 s = _mm512_set1_ps(scale);
    __m512d l0 = _mm512_setzero_pd(), l1 = l0, l2 = l0, l3 = l0;
    if (lane) {
        l0 = _mm512_loadu_pd(lane);
        l1 = _mm512_loadu_pd(lane + 8);
        l2 = _mm512_loadu_pd(lane + 16);
        l3 = _mm512_loadu_pd(lane + 24);
    }
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const float *x = in[0] + at + i;
        __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
        for (int j = 1; j < k; j++) {
            x = in[j] + at + i;
            a = _mm512_add_ps(a, _mm512_loadu_ps(x));
            b = _mm512_add_ps(b, _mm512_loadu_ps(x + 16));
        }
        if (scale != 1.0f) {
            a = _mm512_div_ps(a, s);
            b = _mm512_div_ps(b, s);
        }
        if (stream) {
            _mm512_stream_ps(dst + i, a);
            _mm512_stream_ps(dst + i + 16, b);
        } else {
            _mm512_storeu_ps(dst + i, a);
            _mm512_storeu_ps(dst + i + 16, b);
        }
        if (lane) {
            l0 = add_square(l0, widen_low(a));
            l1 = add_square(l1, widen_high(a));
            l2 = add_square(l2, widen_low(b));
            l3 = add_square(l3, widen_high(b));
        }
    }
    if (lane) {
        _mm512_storeu_pd(lane, l0);
        _mm512_storeu_pd(lane + 8, l1);
        _mm512_storeu_pd(lane + 16, l2);
        _mm512_storeu_pd(lane + 24, l3);
    }
    for (; i < n; i++) { /* i starts on a multiple of 32: element i goes into lane i mod 32 */
        float v = in[0][at + i];
        for (int j = 1; j < k; j++) v += in[j][at + i];
        if (scale != 1.0f) v /= scale;
        dst[i] = v;
        if (lane) {
            double g = v;
            lane[i % 32] += g * g;
        }
    }
}
#else
/* Not built for x86-64: comm/reduce.c never calls the kernel. */
typedef int mt_reduce_avx512_not_built;
#endif
