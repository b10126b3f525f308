/* UTF-8 validity (core/utf8.h). */
#include "core/utf8.h"

int mt_utf8_len(const unsigned char *s) {
    unsigned c = s[0];
    int n;
    unsigned min;
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) n = 2, min = 0x80, c &= 0x1f;
    else if ((c & 0xf0) == 0xe0) n = 3, min = 0x800, c &= 0x0f;
    else if ((c & 0xf8) == 0xf0) n = 4, min = 0x10000, c &= 0x07;
    else return 0;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0; /* also stops at the NUL */
        c = c << 6 | (s[i] & 0x3f);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0;
    return n;
}
