/* The nodes of a multi-node job, seen from one mtrun: joining through node 0's store, publishing
 * and learning the job's first failure, heartbeats, and who has left.
 *
 * Store keys (all under "mtrun/", so they never meet the runtime's own keys, which mtrun's ranks
 * write under "round/K/": MT_STORE_PREFIX). K counts the restarts (0 in the first round):
 *   mtrun/arrivals     c10d: counter of joined nodes; the n-th node to arrive takes node rank n-1
 *   mtrun/config       "nnodes nproc_per_node node backend max_restarts pid host" of the first
 *                      node to arrive (compare_set)
 *   mtrun/node/R       "host pid" of the mtrun that claimed node rank R (compare_set)
 *   mtrun/rK/joined/R  node R has entered round K > 0 (a restart)
 *   mtrun/rK/failure   "code\ntext" or "codeR\ntext" (a rank failed: a restart may follow): the
 *                      round's first failure (compare_set: the first one wins); also set, before
 *                      round K starts, by a node that ends with round K-1 (it will not join)
 *   mtrun/rK/hb/R      node R's heartbeat counter in round K, bumped every second
 *   mtrun/rK/exit/R    node R's exit code, set when its ranks are all gone (whether or not it
 *                      goes on to round K+1)
 *   mtrun/rK/wake/R    wakes node R's failure watcher when the round ends
 *   mtrun/diag/requests  diagnoses asked for (SIGUSR1 to any node's mtrun): a counter each node
 *                      looks at once a second (fr_report.c)
 *   mtrun/diag/ID/R    node R's flight recorder summary for diagnosis ID ("u3": the third asked
 *                      for; "fK": round K's failure), gathered by node 0
 */
#ifndef MTRUN_CLUSTER_H
#define MTRUN_CLUSTER_H

#include "options.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct mtrun_cluster mtrun_cluster;

/* Something that ends the job, learned from the other nodes or the store. */
typedef struct mtrun_cluster_event {
    int code;        /* the exit code mtrun should end with */
    bool publish;    /* this node found it (a lost node): tell the others */
    bool restartable; /* a rank failed: --max_restarts may start a new round */
    char text[1024]; /* printed as "mtrun: <text>; stopping the job" */
} mtrun_cluster_event;

/* Connects to the store at master_addr:port (over loopback when o->hosts_store), takes a node
 * rank in arrival order when o->node_rank is -1 (c10d) and writes it there, checks that this node
 * agrees with the others on --nnodes, --nproc_per_node, the backend and --max_restarts, claims
 * the node rank and waits until every node has joined (at most join_s). timeout_s bounds heartbeats later. Signals arriving on
 * sigfd meanwhile abort the wait. Returns -1 on success, else the exit code after printing why. */
int mtrun_cluster_join(mtrun_options *o, int port, double join_s, double timeout_s, int sigfd,
                       mtrun_cluster **out);

/* A descriptor that becomes readable when mtrun_cluster_check may have something new. */
int mtrun_cluster_fd(const mtrun_cluster *c);

/* Returns true and fills ev once the job must stop (remote failure, lost node, lost store); each
 * cause is reported once. */
bool mtrun_cluster_check(mtrun_cluster *c, mtrun_cluster_event *ev);

/* True once every other node has left or been declared lost. */
bool mtrun_cluster_settled(mtrun_cluster *c);

/* Publishes this node's failure; the round's first failure (maybe another node's) is returned in
 * *code, *restartable and text. When the store cannot be reached, the local failure is kept. */
void mtrun_cluster_publish_failure(mtrun_cluster *c, int *code, bool *restartable, char *text,
                                   size_t cap);

/* Ends this round (its ranks are all gone here) and enters the next one: waits until every node
 * has entered it (at most the join timeout, then names the nodes that did not) and starts its
 * heartbeat. Returns -1, or mtrun's exit code after saying why. */
int mtrun_cluster_next_round(mtrun_cluster *c, int sigfd);

/* Records that this node leaves with exit code `code`. */
void mtrun_cluster_leave(mtrun_cluster *c, int code);

/* Says to the other nodes that this node ends with this round (code, and why: "received
 * SIGTERM", ...): a node entering the next round stops at once, naming it, instead of waiting the
 * join timeout for it. Set as the next round's failure (compare_set: the first one wins). */
void mtrun_cluster_decline_next_round(mtrun_cluster *c, int code, const char *why);

/* The main thread's store connection, for the flight recorder's diagnosis (fr_report.c); NULL
 * once the store stopped answering. Main thread only. */
struct mt_store *mtrun_cluster_store(mtrun_cluster *c);

int mtrun_cluster_nnodes(const mtrun_cluster *c);

/* Stops the heartbeat and closes the connections it can close. */
void mtrun_cluster_close(mtrun_cluster *c);

#endif
