/* The ranks' flight recorder rings, seen from mtrun: the files it makes for its ranks before they
 * start (/dev/shm/mt-fr-<mtrun pid>-<rank>, mode 0600, MT_FLIGHT_RECORDER records each, layout
 * comm/flight_rec_format.h), reading them back at any time (a stopped or dead rank's ring stays
 * readable) and removing them when mtrun ends. */
#ifndef MTRUN_FLIGHTREC_H
#define MTRUN_FLIGHTREC_H

#include "diagnose.h"

#include <stddef.h>
#include <sys/types.h>

typedef struct mtrun_fr mtrun_fr;

/* A ring file being made (flightrec.c's make_ring), renamed into place once whole. */
#define MTRUN_FR_NEW_SUFFIX ".new"

/* Whether a name in /dev/shm is a ring file, "mt-fr-<pid>-<local rank>" (1), one being made,
 * the same with MTRUN_FR_NEW_SUFFIX (2), or neither (0); the numbers are plain decimals, the pid
 * positive. */
int mtrun_fr_parse_name(const char *name, long *pid, int *local);

/* Reads MT_FLIGHT_RECORDER (records per rank, default 2048, 0: off) for this node's nproc ranks
 * (files /dev/shm/mt-fr-<mtrun pid>-<local rank>). *out is NULL when the recorder is off. When on,
 * first removes this user's ring files of mtrun processes that no longer exist (says how many).
 * Returns 0, or 2 after printing why (a value out of range). */
int mtrun_fr_create(int nproc, mtrun_fr **out);

/* Makes (or empties, for a new round) the ring files of node's ranks (global ranks
 * node * nproc + i; a c10d node knows its rank only once it joined). On failure prints why once
 * and turns the recorder off: a job does not fail for want of its diagnosis. */
void mtrun_fr_prepare(mtrun_fr *f, int node);

/* The ring file of local rank i (MT_FLIGHT_RECORDER_FILE for it), or NULL when off. */
const char *mtrun_fr_file(const mtrun_fr *f, int local);

/* Removes the files and frees f (NULL is fine). */
void mtrun_fr_destroy(mtrun_fr *f);

/* Reads the ring at path into r (entries oldest first; r->e malloc'd, free with
 * mtrun_fr_rank_free), with rank, node and the process state of pid ('-' when pid is 0 or
 * gone; pid < 0: the pid the rank wrote into its ring; rank < 0 and node < 0: the rank and the
 * node the ring names). A ring the rank never attached is empty with pid 0. Returns 0, or -1 with why. */
int mtrun_fr_read(const char *path, int rank, int node, pid_t pid, mtrun_fr_rank *r, char *why,
                  size_t cap);

void mtrun_fr_rank_free(mtrun_fr_rank *r);

/* Reads this node's rings (pids[i]: local rank i's process, 0 if none) into *out (n entries,
 * free each with mtrun_fr_rank_free, then the array). Unreadable rings are skipped with a
 * message. Returns how many were read. */
int mtrun_fr_collect(const mtrun_fr *f, const pid_t *pids, mtrun_fr_rank **out);

/* The wall-clock time now, in seconds. */
double mtrun_fr_wall_now(void);

#endif
