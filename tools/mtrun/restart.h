/* --max_restarts: the rounds of a job. A rank that fails anywhere ends the round on every node;
 * while restarts are left, the nodes meet again in the store that outlives the round and start
 * every rank anew (TORCHELASTIC_RESTART_COUNT = the round). */
#ifndef MTRUN_RESTART_H
#define MTRUN_RESTART_H

#include "binding.h"
#include "cluster.h"
#include "options.h"

/* Runs rounds of this node's ranks until one ends without a restart to follow; returns mtrun's
 * exit code. The arguments are mtrun_job_run's. */
int mtrun_run_rounds(const mtrun_options *o, int store_port, mtrun_cluster *cluster,
                     mtrun_binding *binding, int sigfd, double timeout_s, double kill_grace_s);

#endif
