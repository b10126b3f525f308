/* Status names and the per-thread last error. Thread-local like errno: each thread that fails
 * keeps its own message, so the progress thread cannot overwrite the caller's. */
#include "core/error.h"
#include "core/log_internal.h"

#include <meshtrain/log.h>

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MT_ERROR_CAP 2048

static _Thread_local char last_error[MT_ERROR_CAP];

const char *mt_status_str(mt_status status) {
    switch (status) {
    case MT_OK: return "ok";
    case MT_ERR_INVALID_ARG: return "invalid argument";
    case MT_ERR_OUT_OF_MEMORY: return "out of memory";
    case MT_ERR_TIMEOUT: return "timeout";
    case MT_ERR_IO: return "i/o error";
    case MT_ERR_PROTOCOL: return "protocol error";
    case MT_ERR_MISMATCH: return "mismatch";
    case MT_ERR_NOT_FOUND: return "not found";
    case MT_ERR_UNSUPPORTED: return "unsupported";
    case MT_ERR_COMM: return "communication error";
    case MT_ERR_PEER_LOST: return "peer lost";
    case MT_ERR_SYSTEM: return "system error";
    case MT_ERR_INTERNAL: return "internal error";
    case MT_STATUS_COUNT: break;
    }
    return "unknown status";
}

const char *mt_last_error(void) { return last_error; }

void mt_clear_error(void) { last_error[0] = '\0'; }

mt_status mt_error_restore(mt_status status, const char *saved) {
    if (!saved) saved = "";
    char prefix[32] = "";
    if (mt_log_rank() >= 0) snprintf(prefix, sizeof prefix, "rank %d: ", mt_log_rank());
    size_t n = strlen(prefix);
    /* A message taken before this rank was known gets the prefix now, as mt_error would. */
    if (n && strncmp(saved, prefix, n) != 0)
        snprintf(last_error, sizeof last_error, "%s%s", prefix, saved);
    else
        snprintf(last_error, sizeof last_error, "%s", saved);
    return status;
}

static void format_message(char *out, size_t cap, const char *fmt, va_list ap) {
    int rank = mt_log_rank();
    size_t used = 0;
    if (rank >= 0) {
        int n = snprintf(out, cap, "rank %d: ", rank);
        used = n > 0 ? (size_t)n : 0;
    }
    if (used < cap) vsnprintf(out + used, cap - used, fmt, ap);
}

mt_status mt_error(mt_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    format_message(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

mt_status mt_error_errno(mt_status status, int errnum, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    format_message(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    size_t len = strlen(last_error);
    snprintf(last_error + len, sizeof last_error - len, ": %s", strerror(errnum));
    return status;
}

mt_status mt_error_wrap(mt_status status, const char *fmt, ...) {
    char previous[MT_ERROR_CAP];
    const char *inner = last_error;
    /* The previous message already carries the rank prefix; keep it once, at the front. */
    int rank = mt_log_rank();
    char prefix[32] = "";
    if (rank >= 0) snprintf(prefix, sizeof prefix, "rank %d: ", rank);
    size_t plen = strlen(prefix);
    if (plen && strncmp(inner, prefix, plen) == 0) inner += plen;
    snprintf(previous, sizeof previous, "%s", inner);

    char context[MT_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    if (previous[0])
        snprintf(last_error, sizeof last_error, "%s%s: %s", prefix, context, previous);
    else
        snprintf(last_error, sizeof last_error, "%s%s", prefix, context);
    return status;
}
