/* The analysis of the job's flight recorder rings (comm/flight_rec_format.h): which rank the
 * others wait for, and where; or which ranks disagree on a collective. Pure: no I/O, no clock;
 * tested on synthetic rings by tests/tools/test_diagnose.c. */
#ifndef MTRUN_DIAGNOSE_H
#define MTRUN_DIAGNOSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MTRUN_FR_GROUP_CAP 40

/* One collective of one rank, its times wall-clock seconds (0: not yet). */
typedef struct mtrun_fr_entry {
    char group[MTRUN_FR_GROUP_CAP]; /* "dp#2" */
    uint32_t seq;
    int group_size, group_rank;
    int op;            /* mt_op_kind */
    int dtype;         /* mt_dtype */
    uint64_t bytes;
    double queued, started, completed;
    int status;        /* mt_status, once completed */
    int waiting_peer;  /* group rank it waited on, -1 unknown */
} mtrun_fr_entry;

/* One rank's ring as read: its entries oldest first. */
typedef struct mtrun_fr_rank {
    int rank, node;
    int pid;           /* 0: the rank never attached its ring */
    char state;        /* its process's state letter in /proc ('T': stopped), '-' gone/unknown */
    uint64_t total;    /* collectives it ever recorded (more than n once the ring wrapped) */
    double read_at;    /* wall-clock time its ring was read (0: unknown): nodes read theirs
                        * at different times, and a ring read before the others issued a
                        * collective cannot be said to lag behind it */
    mtrun_fr_entry *e;
    int n;
} mtrun_fr_rank;

/* Writes the diagnosis of nranks rings, seen at wall-clock time now, into out (lines ending in
 * '\n'). A rank is only called behind once others have waited for it min_wait_s (a live job's
 * ranks are always a little apart). Returns how many problems it names (ranks behind,
 * disagreements); 0 when all is in step (then the text says what is in flight, if anything). */
int mtrun_diagnose(const mtrun_fr_rank *ranks, int nranks, double now, double min_wait_s,
                   char *out, size_t cap);

/* "all_gather", "reduce_scatter", ... for an mt_op_kind. */
const char *mtrun_fr_op_name(int op);

/* Whether op is a collective (not a send or a receive, whose sequence numbers are per peer). */
bool mtrun_fr_op_is_collective(int op);

#endif
