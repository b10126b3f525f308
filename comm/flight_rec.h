/* Internal: the flight recorder, the ring of this rank's last collectives that mtrun reads when
 * the job hangs or fails (layout and write protocol: comm/flight_rec_format.h; analysis:
 * tools/mtrun/diagnose.c). mtrun makes the ring file before the rank starts and names it in
 * MT_FLIGHT_RECORDER_FILE; without it (MT_FLIGHT_RECORDER=0, or a program not started by mtrun)
 * the recorder is off and every call below returns at once.
 *
 * Cost per collective: one atomic add, a dozen stores and three clock reads. */
#ifndef MT_COMM_FLIGHT_REC_H
#define MT_COMM_FLIGHT_REC_H

#include "comm/work.h"

#include <meshtrain/status.h>

/* A collective was handed to its backend (its seq is set): records it and keeps the record's id
 * on the work (w->fr_id). Thread-safe; user threads. */
void mt_fr_queued(mt_work *w);
/* The host progress thread started the work's schedule. */
void mt_fr_started(mt_work *w);
/* The work finished with status (the first call counts; later ones change nothing). */
void mt_fr_completed(mt_work *w, mt_status status);
/* The host schedule waits on group rank peer (-1: on nothing in particular). */
void mt_fr_waiting(mt_work *w, int peer);

#endif
