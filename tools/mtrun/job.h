/* Supervising this node's ranks: start them, forward their output, and stop them all (the whole
 * job, through the cluster) at the first failure. */
#ifndef MTRUN_JOB_H
#define MTRUN_JOB_H

#include "binding.h"
#include "cluster.h"
#include "options.h"

#include <stddef.h>

/* Runs one round of the ranks of this node (round: restarts before it) until it is over and
 * returns mtrun's exit code. When a rank failed and --max_restarts allows another round,
 * restart_after (cap bytes) holds the failure, else it is "". store_port is the port the store
 * listens on (MASTER_PORT for the ranks); cluster is NULL for a single node. sigfd delivers
 * SIGCHLD, SIGINT and SIGTERM, which the caller has blocked. binding places each rank as it is
 * started. */
int mtrun_job_run(const mtrun_options *o, int round, int store_port, mtrun_cluster *cluster,
                  mtrun_binding *binding, int sigfd, double timeout_s, double kill_grace_s,
                  char *restart_after, size_t cap);

#endif
