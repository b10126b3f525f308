/* Diagnoses from the flight recorder (flightrec.h, diagnose.h): on a rank's failure, on SIGUSR1
 * to any node's mtrun, each node reads its ranks' rings, writes them as JSON lines into the log
 * directory (--log_dir: <job dir>/flight_recorder/<id>-node<N>.jsonl), publishes a summary (each
 * rank's last MTRUN_FR_SUMMARY collectives) to the store, and node 0 gathers them and prints one
 * diagnosis. A single node does the same without the store. */
#ifndef MTRUN_FR_REPORT_H
#define MTRUN_FR_REPORT_H

#include "cluster.h"
#include "options.h"

#include <sys/types.h>

#define MTRUN_FR_SUMMARY 64
/* A diagnosis of a live job calls a rank behind only once others waited this long for it. */
#define MTRUN_FR_LIVE_WAIT_S 1.0

/* One diagnosis named id ("f0": round 0's failure, "u2": the second one asked for) because of
 * why ("rank 3 exited with code 1"). pids[i]: local rank i's process (0 if none). */
void mtrun_fr_report(const mtrun_options *o, mtrun_cluster *cluster, const pid_t *pids,
                     const char *id, const char *why);

/* SIGUSR1: a diagnosis of the running job, asked of every node (through the store). */
void mtrun_fr_request(const mtrun_options *o, mtrun_cluster *cluster, const pid_t *pids);

/* Multi-node, about once a second: takes part in diagnoses another node asked for. */
void mtrun_fr_poll_requests(const mtrun_options *o, mtrun_cluster *cluster, const pid_t *pids);

/* mtrun --diagnose [PID]: prints the diagnosis of this machine's ranks of the running mtrun PID
 * (the only one running when PID is 0) from their rings, without touching the job. Returns
 * mtrun's exit code (0: the diagnosis was printed, whatever it says). */
int mtrun_fr_diagnose_local(long pid);

#endif
