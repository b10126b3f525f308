/* Internal: UTF-8 validity, for text that must be valid UTF-8 wherever it came from (JSON
 * strings: a writer escapes what is not, jansson refuses it). */
#ifndef MT_CORE_UTF8_H
#define MT_CORE_UTF8_H

/* Length of the valid UTF-8 sequence at s (1-4), or 0 when it is not one (a NUL inside the
 * sequence ends it). Overlong forms, surrogates and code points above U+10FFFF are invalid. */
int mt_utf8_len(const unsigned char *s);

#endif
