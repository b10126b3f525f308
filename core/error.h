/* Internal: setting the last error. Library code reports every failure through mt_error so that
 * mt_last_error() names what failed, where (rank, peer, file) and why. */
#ifndef MT_CORE_ERROR_H
#define MT_CORE_ERROR_H

#include <meshtrain/status.h>

/* Sets the calling thread's last error to "rank R: <message>" (rank omitted when unknown) and
 * returns status, so that `return mt_error(MT_ERR_IO, "...", ...)` reads naturally. */
mt_status mt_error(mt_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends context to the current last error: "<context>: <previous message>". Returns status. */
mt_status mt_error_wrap(mt_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Like mt_error, appending ": <strerror(errnum)>". */
mt_status mt_error_errno(mt_status status, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Puts back a message taken earlier from mt_last_error() after calls that overwrote it, with the
 * rank prefix added when it lacks one (taken before the rank was known). Returns status. */
mt_status mt_error_restore(mt_status status, const char *saved);

#endif
