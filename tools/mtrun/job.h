/* Supervising this node's ranks: start them, forward their output, and stop them all (the whole
 * job, through the cluster) at the first failure. */
#ifndef MTRUN_JOB_H
#define MTRUN_JOB_H

#include "binding.h"
#include "cluster.h"
#include "options.h"

/* Runs the ranks of this node until the job is over and returns mtrun's exit code. store_port is
 * the port the store listens on (MASTER_PORT for the ranks); cluster is NULL for a single node.
 * sigfd delivers SIGCHLD, SIGINT and SIGTERM, which the caller has blocked. binding places each
 * rank as it is started. */
int mtrun_job_run(const mtrun_options *o, int store_port, mtrun_cluster *cluster,
                  mtrun_binding *binding, int sigfd, double timeout_s, double kill_grace_s);

#endif
