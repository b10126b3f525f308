/* dtype names and f32 <-> bf16 conversion on the edge cases of round-to-nearest-even; every
 * build of the array conversions this CPU runs (core/cpu/cast_vec.h) against the scalar rule. */
#include "check.h"
#include "numeric.h"

#include "core/cpu/cast_kernels.h"
#include "core/cpu/cpu_features.h"

#include <meshtrain/dtype.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool bf16_is_nan(mt_bf16 b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }

/* Checks that the f32 with these bits converts to the expected bf16 bits. */
#define CHECK_CONV(f32_bits, bf16_bits)                                                            \
    do {                                                                                           \
        mt_bf16 got_ = mt_f32_to_bf16(test_f32_from_bits(f32_bits));                                       \
        CHECK_MSG(got_ == (bf16_bits), "f32 0x%08x -> bf16 0x%04x, expected 0x%04x",               \
                  (unsigned)(f32_bits), (unsigned)got_, (unsigned)(bf16_bits));                    \
    } while (0)

static void test_names(void) {
    CHECK(mt_dtype_size(MT_F32) == 4);
    CHECK(mt_dtype_size(MT_BF16) == 2);
    CHECK(mt_dtype_size(MT_DTYPE_COUNT) == 0);
    CHECK(strcmp(mt_dtype_name(MT_F32), "f32") == 0);
    CHECK(strcmp(mt_dtype_name(MT_BF16), "bf16") == 0);
    CHECK(strcmp(mt_dtype_name((mt_dtype)42), "invalid") == 0);

    const char *f32_names[] = {"f32", "float32", "float", "F32"};
    for (size_t i = 0; i < sizeof f32_names / sizeof *f32_names; i++) {
        mt_dtype d = MT_BF16;
        CHECK_OK(mt_dtype_parse(f32_names[i], &d));
        CHECK_MSG(d == MT_F32, "%s", f32_names[i]);
    }
    const char *bf16_names[] = {"bf16", "bfloat16", "BF16"};
    for (size_t i = 0; i < sizeof bf16_names / sizeof *bf16_names; i++) {
        mt_dtype d = MT_F32;
        CHECK_OK(mt_dtype_parse(bf16_names[i], &d));
        CHECK_MSG(d == MT_BF16, "%s", bf16_names[i]);
    }
    mt_dtype d;
    CHECK(mt_dtype_parse("fp8", &d) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "\"fp8\"") != NULL, "message: %s", mt_last_error());
    CHECK(mt_dtype_parse("", &d) == MT_ERR_INVALID_ARG);
    CHECK(mt_dtype_parse(NULL, &d) == MT_ERR_INVALID_ARG);
}

static void test_special_values(void) {
    CHECK_CONV(0x00000000u, 0x0000u); /* +0 */
    CHECK_CONV(0x80000000u, 0x8000u); /* -0 keeps its sign */
    CHECK_CONV(0x3f800000u, 0x3f80u); /* 1 */
    CHECK_CONV(0xc0490fdbu, 0xc049u); /* -pi rounds down in magnitude */
    CHECK_CONV(0x7f800000u, 0x7f80u); /* +inf */
    CHECK_CONV(0xff800000u, 0xff80u); /* -inf */

    /* NaNs stay NaN with their sign, quiet, whatever the payload. */
    CHECK_CONV(0x7fc00000u, 0x7fc0u);
    CHECK_CONV(0xffc00000u, 0xffc0u);
    uint32_t nans[] = {0x7f800001u, 0xff800001u, 0x7f80ffffu, 0x7fffffffu, 0xffffffffu,
                       0x7f810000u, 0x7fbfffffu, 0x7f807fffu, 0x7f808000u};
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) {
        mt_bf16 b = mt_f32_to_bf16(test_f32_from_bits(nans[i]));
        CHECK_MSG(bf16_is_nan(b), "f32 NaN 0x%08x -> 0x%04x is not a NaN", nans[i], b);
        CHECK_MSG((b & 0x8000u) == ((nans[i] >> 16) & 0x8000u), "NaN 0x%08x lost its sign",
                  nans[i]);
        CHECK_MSG((b & 0x0040u) != 0, "NaN 0x%08x -> 0x%04x is not quiet", nans[i], b);
        CHECK(isnan(mt_bf16_to_f32(b)));
    }
    CHECK(isnan(mt_bf16_to_f32(mt_f32_to_bf16(NAN))));
    CHECK(isinf(mt_bf16_to_f32(mt_f32_to_bf16(INFINITY))));
}

static void test_overflow(void) {
    CHECK_CONV(0x7f7fffffu, 0x7f80u); /* FLT_MAX rounds up to +inf */
    CHECK_CONV(0xff7fffffu, 0xff80u); /* -FLT_MAX to -inf */
    CHECK_CONV(0x7f7f8000u, 0x7f80u); /* tie above the largest bf16, odd: rounds up to inf */
    CHECK_CONV(0x7f7f7fffu, 0x7f7fu); /* just below the tie: the largest finite bf16 */
    CHECK_CONV(0x7f7e8000u, 0x7f7eu); /* tie with an even kept part stays */
    CHECK(isinf(mt_bf16_to_f32(mt_f32_to_bf16(3.4028235e38f))));
}

static void test_denormals(void) {
    CHECK_CONV(0x00000001u, 0x0000u); /* the smallest f32 denormal rounds to +0 */
    CHECK_CONV(0x80000001u, 0x8000u); /* ... and to -0 when negative */
    CHECK_CONV(0x00008000u, 0x0000u); /* exactly half the smallest bf16 denormal: tie to even 0 */
    CHECK_CONV(0x00008001u, 0x0001u); /* just above half */
    CHECK_CONV(0x00010000u, 0x0001u); /* the smallest bf16 denormal is exact */
    CHECK_CONV(0x00018000u, 0x0002u); /* tie with odd kept part rounds up */
    CHECK_CONV(0x00028000u, 0x0002u); /* tie with even kept part stays */
    CHECK_CONV(0x007fffffu, 0x0080u); /* the largest f32 denormal becomes the smallest normal */
    CHECK_CONV(0x807f0000u, 0x807fu); /* a negative bf16 denormal is exact */
    CHECK(mt_bf16_to_f32(0x0001u) == ldexpf(1.0f, -133));
    CHECK(mt_bf16_to_f32(0x8001u) == -ldexpf(1.0f, -133));
    CHECK(mt_bf16_to_f32(0x0080u) == ldexpf(1.0f, -126));
}

static void test_ties(void) {
    CHECK_CONV(0x3f808000u, 0x3f80u); /* 1 + 2^-8: tie, kept part even: down */
    CHECK_CONV(0x3f818000u, 0x3f82u); /* tie, kept part odd: up */
    CHECK_CONV(0xbf808000u, 0xbf80u); /* negative ties behave the same on the magnitude */
    CHECK_CONV(0xbf818000u, 0xbf82u);
    CHECK_CONV(0x3f807fffu, 0x3f80u); /* just below a tie: down */
    CHECK_CONV(0x3f808001u, 0x3f81u); /* just above a tie: up */
    CHECK_CONV(0x3fff8000u, 0x4000u); /* a tie that carries into the exponent */
    CHECK(mt_f32_to_bf16(1.00390625f) == 0x3f80u); /* 1 + 2^-8 as a literal */
}

/* Every bf16 widens exactly and narrows back to itself (NaNs stay NaN with their sign). */
static void test_round_trip_all(void) {
    int bad = 0;
    for (uint32_t b = 0; b <= 0xffffu; b++) {
        float f = mt_bf16_to_f32((mt_bf16)b);
        if (test_f32_bits(f) != b << 16) bad++;
        mt_bf16 back = mt_f32_to_bf16(f);
        if (bf16_is_nan((mt_bf16)b)) {
            if (!bf16_is_nan(back) || (back & 0x8000u) != (b & 0x8000u)) bad++;
            if ((b & 0x0040u) && back != b) bad++; /* a quiet NaN comes back bit for bit */
        } else if (back != b) {
            bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d bf16 patterns did not round-trip", bad);
}

static void test_arrays(void) {
    enum { N = 1000 };
    float src[N], wide[N];
    mt_bf16 narrow[N];
    uint32_t state = 12345;
    for (int i = 0; i < N; i++) {
        state = state * 1664525u + 1013904223u;
        src[i] = test_f32_from_bits(state); /* any bit pattern: normals, denormals, inf, NaN */
    }
    mt_f32_to_bf16_array(src, narrow, N);
    mt_bf16_to_f32_array(narrow, wide, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        if (narrow[i] != mt_f32_to_bf16(src[i])) bad++;
        if (test_f32_bits(wide[i]) != (uint32_t)narrow[i] << 16) bad++;
        /* Rounding error is at most half a bf16 ulp (2^-9 relative) for finite normals. */
        if (isnormal(src[i]) && isfinite(wide[i]) &&
            fabsf(wide[i] - src[i]) > fabsf(src[i]) * 0x1p-8f)
            bad++;
    }
    CHECK_MSG(bad == 0, "%d array elements differ from the scalar conversion", bad);
    mt_f32_to_bf16_array(src, narrow, 0); /* zero elements: nothing to do, nothing to crash */
}

/* Each build of the array conversions this CPU runs gives the scalar rule's bits: every upper
 * half with the lower halves around a tie (so every NaN payload, infinity, denormal and carry),
 * then every bf16 widened, on lengths that leave every vector tail. */
static void test_array_builds(void) {
    static const uint32_t lows[] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
    enum { NLOW = sizeof lows / sizeof *lows, N = 65536 * NLOW };
    const struct {
        const char *name;
        bool runs;
        mt_cast_narrow_fn narrow;
        mt_cast_widen_fn widen;
    } builds[] = {
        {"generic", true, mt_cast_f32_to_bf16_generic, mt_cast_bf16_to_f32_generic},
        {"avx2", mt_cpu_has(MT_CPU_AVX2), mt_cast_f32_to_bf16_avx2, mt_cast_bf16_to_f32_avx2},
        {"avx512", mt_cpu_has(MT_CPU_AVX512F) && mt_cpu_has(MT_CPU_AVX512BW),
         mt_cast_f32_to_bf16_avx512, mt_cast_bf16_to_f32_avx512},
    };
    float *src = malloc(N * sizeof *src), *wide = malloc(65536 * sizeof *wide);
    mt_bf16 *narrow = malloc(N * sizeof *narrow), *all = malloc(65536 * sizeof *all);
    CHECK(src && wide && narrow && all);
    if (!src || !wide || !narrow || !all) goto out;
    for (uint32_t hi = 0; hi < 65536; hi++) {
        all[hi] = (mt_bf16)hi;
        for (int l = 0; l < NLOW; l++) src[hi * NLOW + l] = test_f32_from_bits(hi << 16 | lows[l]);
    }
    for (size_t b = 0; b < sizeof builds / sizeof *builds; b++) {
        if (!builds[b].runs) continue;
        int bad = 0;
        /* Whole, then short lengths from odd offsets: every tail a vector loop leaves. */
        builds[b].narrow(src, narrow, N);
        for (size_t i = 0; i < N; i++) bad += narrow[i] != mt_f32_to_bf16(src[i]);
        for (size_t len = 1; len <= 40; len++) {
            size_t at = 1000 * len + len;
            memset(narrow + at, 0xab, (len + 1) * sizeof *narrow);
            builds[b].narrow(src + at, narrow + at, len);
            for (size_t i = 0; i < len; i++) bad += narrow[at + i] != mt_f32_to_bf16(src[at + i]);
            bad += narrow[at + len] != 0xababu; /* nothing written past the end */
        }
        builds[b].widen(all, wide, 65536);
        for (uint32_t hi = 0; hi < 65536; hi++) bad += test_f32_bits(wide[hi]) != hi << 16;
        CHECK_MSG(bad == 0, "the %s build of the bf16 casts differs from the scalar rule in %d "
                  "elements", builds[b].name, bad);
        printf("bf16 casts: %s build checked\n", builds[b].name);
    }
out:
    free(src), free(wide), free(narrow), free(all);
}

int main(void) {
    test_names();
    test_special_values();
    test_overflow();
    test_denormals();
    test_ties();
    test_round_trip_all();
    test_arrays();
    test_array_builds();
    return check_report("test_dtype");
}
