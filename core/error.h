/* Internal: setting the last error. Library code reports every failure through mt_error so that
 * mt_last_error() names what failed, where (rank, peer, file) and why. */
#ifndef MT_CORE_ERROR_H
#define MT_CORE_ERROR_H

#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

/* Sets the calling thread's last error to "rank R: <message>" (rank omitted when unknown) and
 * returns status, so that `return mt_error(MT_ERR_IO, "...", ...)` reads naturally. */
mt_status mt_error(mt_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends context to the current last error: "<context>: <previous message>". Returns status. */
mt_status mt_error_wrap(mt_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Like mt_error, appending ": <strerror(errnum)>". */
mt_status mt_error_errno(mt_status status, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The process is failing: a module's forward/backward or the program (mt_error_set) reported an
 * error that nothing has recovered from yet (message: what it said; it replaces an earlier
 * record). mt_finalize reads it to skip its barrier and tell the others. */
void mt_failure_note(mt_status status, const char *message);
/* A collective failed: its group's members are out of step for good (never cleared). Its
 * message is recorded only when no other failure was. */
void mt_failure_note_comm(mt_status status, const char *message);
/* A root module's forward/backward succeeded: the earlier failure was recovered from (a comm
 * failure stays). */
void mt_failure_clear(void);
/* Forgets every record, the collectives' too (mt_init: a new job). */
void mt_failure_reset(void);
/* Clears the calling thread's message only (library code that starts a fresh attempt); the
 * public mt_clear_error also forgets the program's failure record. */
void mt_error_clear_message(void);
/* Whether the process is failing; if so, the first failure's status and message. */
bool mt_failure_pending(mt_status *status, char *message, size_t cap);

/* Puts back a message taken earlier from mt_last_error() after calls that overwrote it, with the
 * rank prefix added when it lacks one (taken before the rank was known). Returns status. */
mt_status mt_error_restore(mt_status status, const char *saved);

#endif
