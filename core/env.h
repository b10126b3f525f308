/* Internal: reading the numeric MT_* environment variables. Every one goes through these so that
 * a value out of range is refused with one message naming the variable, its value and the range,
 * rather than wrapped or truncated into something that hangs later (MT_COMM_WINDOW=4294967296
 * once became a window of 0 and every collective waited for ever). */
#ifndef MT_CORE_ENV_H
#define MT_CORE_ENV_H

#include <meshtrain/status.h>

#include <stddef.h>

/* An integer in lo..hi; unset or empty: *out = fallback. Otherwise MT_ERR_INVALID_ARG with
 * "NAME=VALUE is not an integer in lo..hi" (what the variable sets, `what`, appended). */
mt_status mt_env_int(const char *name, long long lo, long long hi, long long fallback,
                     const char *what, long long *out);

/* A number of seconds (a decimal fraction allowed) in lo..hi, likewise. */
mt_status mt_env_seconds(const char *name, double lo, double hi, double fallback,
                         const char *what, double *out);

/* A byte count (mt_parse_bytes: "64MiB", "4096") in lo..hi, likewise. */
mt_status mt_env_bytes(const char *name, size_t lo, size_t hi, size_t fallback,
                       const char *what, size_t *out);

/* MT_TIMEOUT_S, how long the job's processes wait for each other: 300 s when unset, refused
 * with a message naming it when it is not a number of seconds in 0.001..1e8 (mt_init and mtrun
 * fail on it; the store's mt_default_timeout warns and uses the default). */
#define MT_TIMEOUT_DEFAULT_S 300.0
#define MT_TIMEOUT_MIN_S 0.001
#define MT_TIMEOUT_MAX_S 1e8
mt_status mt_timeout_from_env(double *out);

#endif
