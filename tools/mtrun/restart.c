/* A round ends on every node before the next begins: the failed round's ranks are all gone here
 * (mtrun_job_run returns only then), and mtrun_cluster_next_round waits for every other node to
 * arrive, so no rank of a new round ever meets a rank of the old one. The ranks' own store keys
 * are kept apart by MT_STORE_PREFIX (spawn.c), mtrun's by the round in its keys (cluster.h). */
#include "restart.h"

#include "job.h"
#include "msg.h"

int mtrun_run_rounds(const mtrun_options *o, int store_port, mtrun_cluster *cluster,
                     mtrun_binding *binding, int sigfd, double timeout_s, double kill_grace_s) {
    for (int round = 0;; round++) {
        char failure[1024];
        int code = mtrun_job_run(o, round, store_port, cluster, binding, sigfd, timeout_s,
                                 kill_grace_s, failure, sizeof failure);
        if (!failure[0]) return code;
        mtrun_msg("restarting every rank (restart %d of %d, --max_restarts) after: %s", round + 1,
                  o->max_restarts, failure);
        if (cluster) {
            code = mtrun_cluster_next_round(cluster, sigfd);
            if (code >= 0) return code;
        }
    }
}
