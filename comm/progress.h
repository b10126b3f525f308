/* Internal: the host backend's communication progress thread (comm/progress.c), which runs the
 * schedules of queued work on the UCX transport. The transport starts and stops it. */
#ifndef MT_COMM_PROGRESS_H
#define MT_COMM_PROGRESS_H

#include "comm/transport.h"

#include <meshtrain/status.h>

mt_status mt_progress_start(mt_transport *tr);
/* Stops the thread once only failed work whose requests never came back is left. */
void mt_progress_stop(mt_transport *tr);
/* Frees failed work the stopped thread left behind (after the worker is destroyed). */
void mt_progress_free_zombies(mt_transport *tr);
/* The CPU seconds the progress thread has run so far (its copies, sums, UCX progress and
 * wake-ups), or a negative value when it is not running or its clock cannot be read. For
 * benchmarks that tell communication's work from the training thread's; call it from the thread
 * that owns the transport, not while mt_progress_stop runs or after the transport is gone. */
double mt_progress_cpu_s(mt_transport *tr);

#endif
