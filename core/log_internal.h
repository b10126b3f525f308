/* Internal: the rank that log lines (core/log.c) and error messages (core/status.c) are prefixed
 * with, set by mt_init (mesh/runtime.c) once the rank is known. */
#ifndef MT_CORE_LOG_INTERNAL_H
#define MT_CORE_LOG_INTERNAL_H

/* Sets the rank shown in log lines and error messages (-1: unknown). */
void mt_log_set_rank(int rank);

/* The rank set by mt_log_set_rank, or -1. */
int mt_log_rank(void);

#endif
