/* Internal: the f32 <-> bf16 rule as inline functions, so that hot loops (reductions, casts)
 * vectorize while core/dtype.c's public functions and they share one definition. */
#ifndef MT_CORE_BF16_INLINE_H
#define MT_CORE_BF16_INLINE_H

#include <stdint.h>
#include <string.h>

static inline float mt_bf16_widen(uint16_t value) {
    uint32_t bits = (uint32_t)value << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline uint16_t mt_bf16_round(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    /* A NaN whose payload sits only in the dropped half would truncate (or round) to infinity:
     * keep the sign and upper payload and set the quiet bit so it stays a NaN. */
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u);
    /* Round to nearest, ties to even: adding 0x7fff plus the kept LSB carries into the upper half
     * exactly when the dropped half is above one half, or equal to it with an odd kept part.
     * The carry may ripple into the exponent, which is right: the largest finite values round up
     * to infinity and the largest denormals to the smallest normal. */
    uint32_t lsb = (bits >> 16) & 1u;
    return (uint16_t)((bits + 0x7fffu + lsb) >> 16);
}

#endif
