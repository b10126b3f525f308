#include "core/copy_stream.h"

#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Below this, the destination probably stays in cache and is used soon: plain memcpy. */
#define STREAM_MIN_BYTES ((size_t)256 << 10)

void mt_copy_stream(void *dst, const void *src, size_t bytes) {
#if defined(__SSE2__)
    if (bytes >= STREAM_MIN_BYTES) {
        char *d = dst;
        const char *s = src;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15; /* align the destination to 16 bytes */
        memcpy(d, s, head);
        d += head;
        s += head;
        bytes -= head;
        size_t blocks = bytes / 64;
        for (size_t i = 0; i < blocks; i++, d += 64, s += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)s);
            __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
            __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
            _mm_stream_si128((__m128i *)d, a);
            _mm_stream_si128((__m128i *)(d + 16), b);
            _mm_stream_si128((__m128i *)(d + 32), c);
            _mm_stream_si128((__m128i *)(d + 48), e);
        }
        memcpy(d, s, bytes % 64);
        /* Streaming stores are weakly ordered: make them visible before anyone is told. */
        _mm_sfence();
        return;
    }
#endif
    memcpy(dst, src, bytes);
}
