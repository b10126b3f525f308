/* Status names and the per-thread last error. Thread-local like errno: each thread that fails
 * keeps its own message, so the progress thread cannot overwrite the caller's. */
#include "core/error.h"
#include "core/log_internal.h"

#include <meshtrain/log.h>

#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define MT_ERROR_CAP 2048

static _Thread_local char last_error[MT_ERROR_CAP];
/* Process-wide, unlike the message: mt_finalize may run on another thread than the failure
 * (the progress thread notes failed collectives). */
static pthread_mutex_t failure_mu = PTHREAD_MUTEX_INITIALIZER;
static bool failure_pending, comm_failed;
static mt_status failure_status;
static char failure_message[1024];

/* The program's own report (a root module's failure, mt_error_set) says most: it replaces what
 * was recorded. A collective's failure, noted by the thread that saw it, is kept only when
 * nothing else was (it is usually the consequence of another rank's error). */
static void note(bool comm, mt_status status, const char *message) {
    pthread_mutex_lock(&failure_mu);
    if (!comm || (!failure_pending && !comm_failed)) {
        failure_status = status;
        snprintf(failure_message, sizeof failure_message, "%s", message ? message : "");
    }
    if (comm) comm_failed = true;
    else failure_pending = true;
    pthread_mutex_unlock(&failure_mu);
}

void mt_failure_note(mt_status status, const char *message) { note(false, status, message); }
void mt_failure_note_comm(mt_status status, const char *message) { note(true, status, message); }

void mt_failure_clear(void) {
    pthread_mutex_lock(&failure_mu);
    failure_pending = false;
    pthread_mutex_unlock(&failure_mu);
}

void mt_failure_reset(void) {
    pthread_mutex_lock(&failure_mu);
    failure_pending = comm_failed = false;
    pthread_mutex_unlock(&failure_mu);
}

bool mt_failure_pending(mt_status *status, char *message, size_t cap) {
    pthread_mutex_lock(&failure_mu);
    bool pending = failure_pending || comm_failed;
    if (pending && status) *status = failure_status;
    if (pending && message && cap) snprintf(message, cap, "%s", failure_message);
    pthread_mutex_unlock(&failure_mu);
    return pending;
}

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

void mt_error_clear_message(void) { last_error[0] = '\0'; }

/* A program that clears its error has dealt with it: mt_finalize need not abort the job. */
void mt_clear_error(void) {
    last_error[0] = '\0';
    mt_failure_clear();
}

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

mt_status mt_error_set(mt_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    format_message(last_error, sizeof last_error, fmt ? fmt : "", ap);
    va_end(ap);
    if (status != MT_OK) mt_failure_note(status, last_error);
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
