/* Numeric MT_* environment variables, range-checked (core/env.h). */
#include "core/env.h"

#include "core/error.h"

#include <meshtrain/memory.h>

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

static const char *value_of(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* strtoll and strtod skip leading blanks; a value is the number alone. */
static bool starts_blank(const char *v) { return isspace((unsigned char)v[0]) != 0; }

mt_status mt_env_int(const char *name, long long lo, long long hi, long long fallback,
                     const char *what, long long *out) {
    *out = fallback;
    const char *v = value_of(name);
    if (!v) return MT_OK;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || starts_blank(v) || x < lo || x > hi)
        return mt_error(MT_ERR_INVALID_ARG, "%s=%s is not an integer in %lld..%lld (%s)", name, v,
                        lo, hi, what);
    *out = x;
    return MT_OK;
}

mt_status mt_env_seconds(const char *name, double lo, double hi, double fallback,
                         const char *what, double *out) {
    *out = fallback;
    const char *v = value_of(name);
    if (!v) return MT_OK;
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || starts_blank(v) || !isfinite(x) || x < lo || x > hi)
        return mt_error(MT_ERR_INVALID_ARG, "%s=%s is not a number of seconds in %g..%g (%s)",
                        name, v, lo, hi, what);
    *out = x;
    return MT_OK;
}

mt_status mt_env_bytes(const char *name, size_t lo, size_t hi, size_t fallback, const char *what,
                       size_t *out) {
    *out = fallback;
    const char *v = value_of(name);
    if (!v) return MT_OK;
    size_t x = 0;
    if (mt_parse_bytes(v, &x) != MT_OK || x < lo || x > hi)
        return mt_error(MT_ERR_INVALID_ARG, "%s=%s is not a byte count in %zu..%zu (%s)", name, v,
                        lo, hi, what);
    *out = x;
    return MT_OK;
}

mt_status mt_timeout_from_env(double *out) {
    return mt_env_seconds("MT_TIMEOUT_S", MT_TIMEOUT_MIN_S, MT_TIMEOUT_MAX_S, MT_TIMEOUT_DEFAULT_S,
                          "how long the job's processes wait for each other", out);
}
