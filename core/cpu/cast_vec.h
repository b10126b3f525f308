/* Internal: the f32 <-> bf16 array conversions written once as plain loops that the compiler
 * vectorises, compiled once per instruction set (core/cpu/cast_{generic,avx2,avx512}.c define
 * MT_CAST_NAME before including this file; -O3 and the set's flags in CMakeLists.txt). Integer
 * operations only, so every build gives the same bits: those of core/bf16_inline.h, round to
 * nearest even with NaNs kept quiet NaNs, here without a branch so that the loop vectorises
 * (tests/core/test_dtype.c compares every build this CPU runs with the scalar rule). Why per
 * instruction set: the library's baseline x86-64 build made SSE2 code with word shuffles that
 * ran the narrowing at 3.7 GB/s on one core, where AVX-512 BW's vpmovdw reaches the copy speed
 * (13 GB/s; docs/benchmarks.md, "bf16 casts"), and FSDP narrows every gradient and parameter
 * of a bf16 model once a step. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MT_CAST_CAT2(a, b) a##_##b
#define MT_CAST_CAT(a, b) MT_CAST_CAT2(a, b)

void MT_CAST_CAT(mt_cast_f32_to_bf16, MT_CAST_NAME)(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, src + i, sizeof bits);
        uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
        uint32_t quiet_nan = (bits >> 16) | 0x0040u;
        dst[i] = (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
    }
}

void MT_CAST_CAT(mt_cast_bf16_to_f32, MT_CAST_NAME)(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)src[i] << 16;
        memcpy(dst + i, &bits, sizeof bits);
    }
}
