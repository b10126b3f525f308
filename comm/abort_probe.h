/* Internal: whether the job was aborted elsewhere, asked by waits that would otherwise sleep
 * until MT_TIMEOUT_S for a rank that has given up.
 *
 * The runtime registers a probe (it reads the rendezvous store's abort record, written by
 * mt_abort or by a failing rank's mt_finalize); the backends' waits call mt_comm_job_aborted
 * while they wait, and end their work with the aborting rank's message. One probe per process;
 * only user threads call it (the store client is theirs). */
#ifndef MT_COMM_ABORT_PROBE_H
#define MT_COMM_ABORT_PROBE_H

#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

/* Returns true when the job was aborted, with the aborting rank's status (the cause: a wait that
 * ends because of it reports that status) and message. */
typedef bool (*mt_abort_probe_fn)(void *arg, mt_status *status, char *why, size_t cap);

/* Registers (fn non-NULL) or removes (fn NULL) the process's probe. */
void mt_comm_set_abort_probe(mt_abort_probe_fn fn, void *arg);

/* Asks the probe, at most every MT_ABORT_PROBE_INTERVAL_S per process (a wait calls it on every
 * wake-up); false without a probe. */
bool mt_comm_job_aborted(mt_status *status, char *why, size_t cap);

/* How often a wait looks (seconds): a job whose rank aborted ends within about this long. */
#define MT_ABORT_PROBE_INTERVAL_S 0.5

#endif
