/* Memory categories and byte counts as people write and read them. */
#include "core/error.h"

#include <meshtrain/memory.h>

#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

const char *mt_mem_category_name(mt_mem_category category) {
    switch (category) {
    case MT_MEM_PARAMS: return "params";
    case MT_MEM_GRADS: return "grads";
    case MT_MEM_OPTIMIZER: return "optimizer";
    case MT_MEM_ACTIVATIONS: return "activations";
    case MT_MEM_COMM: return "comm";
    case MT_MEM_OTHER: return "other";
    case MT_MEM_CATEGORY_COUNT: break;
    }
    return "invalid";
}

typedef struct unit_suffix {
    const char *name;
    uint64_t multiplier;
} unit_suffix;

static const unit_suffix suffixes[] = {
    {"B", 1ull},
    {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"TiB", 1ull << 40},
    {"KB", 1000ull}, {"MB", 1000000ull}, {"GB", 1000000000ull}, {"TB", 1000000000000ull},
};

/* Fraction digits beyond this are accepted but ignored: with at most 6 of them, fraction x
 * multiplier (< 10^6 x 2^40) cannot overflow 64 bits. */
#define MAX_FRACTION_DIGITS 6

static mt_status bad_bytes(const char *text, const char *why) {
    return mt_error(MT_ERR_INVALID_ARG,
                    "cannot parse \"%s\" as a byte count: %s (examples: 1048576, 512MiB, 2 GiB, "
                    "1.5GB)", text, why);
}

mt_status mt_parse_bytes(const char *text, size_t *out) {
    if (!text || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_parse_bytes: text and out must not be NULL");
    const char *p = text;
    while (isspace((unsigned char)*p)) p++;
    if (*p == '-') return bad_bytes(text, "a byte count cannot be negative");
    if (*p == '+') p++;
    if (!isdigit((unsigned char)*p) && !(*p == '.' && isdigit((unsigned char)p[1])))
        return bad_bytes(text, "it does not start with a number");

    uint64_t whole = 0;
    bool overflow = false;
    for (; isdigit((unsigned char)*p); p++) {
        if (__builtin_mul_overflow(whole, 10u, &whole) ||
            __builtin_add_overflow(whole, (uint64_t)(*p - '0'), &whole))
            overflow = true;
    }
    uint64_t fraction = 0, fraction_scale = 1;
    bool has_fraction = false;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) return bad_bytes(text, "a digit must follow the '.'");
        for (int digits = 0; isdigit((unsigned char)*p); p++, digits++) {
            if (digits >= MAX_FRACTION_DIGITS) continue;
            fraction = fraction * 10 + (uint64_t)(*p - '0');
            fraction_scale *= 10;
            if (*p != '0') has_fraction = true;
        }
    }
    while (*p == ' ' || *p == '\t') p++;

    const char *unit = p;
    while (isalpha((unsigned char)*p)) p++;
    size_t unit_len = (size_t)(p - unit);
    while (isspace((unsigned char)*p)) p++;
    if (*p) return bad_bytes(text, "unexpected characters after the number");

    uint64_t multiplier = 1;
    if (unit_len) {
        const unit_suffix *found = NULL;
        for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
            if (strlen(suffixes[i].name) == unit_len &&
                !strncasecmp(unit, suffixes[i].name, unit_len)) {
                found = &suffixes[i];
                break;
            }
        }
        if (!found)
            return bad_bytes(text, "unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
        multiplier = found->multiplier;
    }
    if (has_fraction && multiplier == 1)
        return bad_bytes(text, "a number of bytes must be whole");

    uint64_t bytes;
    if (overflow || __builtin_mul_overflow(whole, multiplier, &bytes) ||
        __builtin_add_overflow(bytes, fraction * multiplier / fraction_scale, &bytes) ||
        bytes > SIZE_MAX)
        return bad_bytes(text, "the value is too large");
    *out = (size_t)bytes;
    return MT_OK;
}

const char *mt_format_bytes(size_t bytes, char *buf, size_t cap) {
    static const char *units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (!buf || cap == 0) return buf;
    if (bytes < 1024) {
        snprintf(buf, cap, "%zu B", bytes);
        return buf;
    }
    double value = (double)bytes / 1024.0;
    size_t u = 0;
    /* Move up a unit when two decimals would print 1024.00 of the smaller one. */
    while (value >= 1023.995 && u + 1 < sizeof units / sizeof units[0]) {
        value /= 1024.0;
        u++;
    }
    snprintf(buf, cap, "%.2f %s", value, units[u]);
    return buf;
}
