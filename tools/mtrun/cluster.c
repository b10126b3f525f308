/* Threads: the heartbeat thread bumps this node's counter every second and watches the others'
 * counters and exit keys; the watcher thread blocks in the store until mtrun/failure (or its own
 * wake-up key, set when mtrun is done) exists, so that a failure anywhere reaches every node at
 * once, without polling. Each has its own store connection so that a blocked wait never delays a
 * heartbeat. They report to the main loop through a pipe. */
#include "cluster.h"

#include "core/clock.h"
#include "store/store_internal.h" /* mt_store_wait_any */
#include "msg.h"

#include <meshtrain/store.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#define JOIN_SLICE_S 1.0      /* how often a rendezvous wait looks at signals and failures */
#define WATCH_SLICE_S 3600.0  /* a watcher's get is simply re-issued after this long */

struct mtrun_cluster {
    int nnodes, node, nproc, port;
    int round;              /* restarts so far: every per-round key carries it */
    int backend;            /* mtrun_rdzv_backend */
    int max_restarts;       /* --max_restarts: every node must agree (a restart needs them all) */
    char addr[256], job[256];
    double timeout, join_timeout;
    const char *join_what; /* what set join_timeout, for messages */
    const char *host_label; /* who hosts the store, for messages */
    char host_label_buf[320]; /* "node 0 on host NAME", once node 0's host is known */
    char (*hosts)[64];      /* each node's host name (from its claim), for messages */
    mt_store *main_conn, *hb_conn, *watch_conn;
    int notify_r, notify_w;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;              /* heartbeat thread: leave now */
    bool closing;           /* connection errors from now on are expected */
    double last_ok;         /* when the heartbeat last got an answer from the store */
    bool have_event, event_taken;
    mtrun_cluster_event event;
    bool settled;
    bool store_gone;        /* the store stopped answering: no more calls to it from the main
                             * thread, each would wait for the same silence again */

    pthread_t hb_thread, watch_thread;
    bool hb_started, watch_started;
    bool watch_done;        /* the watcher thread has returned */
    /* heartbeat thread only */
    int64_t *hb_seen;
    double *hb_changed;
    unsigned char *left, *lost;
};

/* A watcher stuck in a store that stopped answering cannot be joined; mtrun then exits under it,
 * and the cluster it uses stays allocated (reachable from here). */
mtrun_cluster *volatile mtrun_abandoned_cluster;

static void notify(mtrun_cluster *c) {
    char b = 1;
    (void)!write(c->notify_w, &b, 1);
}

/* "mtrun/r<round>/<what>": the keys of one round, so that a restarted job's rounds never meet. */
static void round_key(const mtrun_cluster *c, char *buf, size_t cap, const char *what, int node) {
    if (node >= 0)
        snprintf(buf, cap, "mtrun/r%d/%s/%d", c->round, what, node);
    else
        snprintf(buf, cap, "mtrun/r%d/%s", c->round, what);
}

/* Records the first cause that ends the round; later ones are dropped. Caller holds mu. */
static void set_event_locked(mtrun_cluster *c, int code, bool publish, bool restartable,
                             const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void set_event_locked(mtrun_cluster *c, int code, bool publish, bool restartable,
                             const char *fmt, ...) {
    if (c->have_event || c->closing) return;
    c->have_event = true;
    c->event.code = code;
    c->event.publish = publish;
    c->event.restartable = restartable;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->event.text, sizeof c->event.text, fmt, ap);
    va_end(ap);
    notify(c);
}

static void store_lost_locked(mtrun_cluster *c, const char *why) {
    c->store_gone = true;
    set_event_locked(c, 1, false, false, "lost the rendezvous store at %s:%d (%s): %s", c->addr,
                     c->port, c->host_label, why);
}

/* Whether the main thread may still call the store: once it stopped answering, each call would
 * wait for the same silence again while the ranks and the other nodes wait for this node. */
static bool store_usable(mtrun_cluster *c) {
    pthread_mutex_lock(&c->mu);
    bool gone = c->store_gone;
    pthread_mutex_unlock(&c->mu);
    return !gone && c->main_conn;
}

/* Copies a store value into a NUL-terminated buffer (values are bytes, not strings). */
static void copy_value(const void *v, size_t len, char *buf, size_t cap) {
    if (!v) len = 0;
    if (len >= cap) len = cap - 1;
    if (len) memcpy(buf, v, len);
    buf[len] = '\0';
}

/* A round's failure key holds "code\ntext", or "codeR\ntext" when a restart may follow (a rank
 * failed, rather than a node being stopped or lost). */
static int format_failure(char *value, size_t cap, int code, bool restartable, const char *text) {
    int n = snprintf(value, cap, "%d%s\n%s", code, restartable ? "R" : "", text);
    return n < (int)cap ? n : (int)cap - 1;
}

static void parse_failure(const void *raw, size_t len, int *code, bool *restartable, char *text,
                          size_t cap) {
    char value[1200];
    copy_value(raw, len, value, sizeof value);
    char *end;
    long v = strtol(value, &end, 10);
    *code = (v > 0 && v < 256) ? (int)v : 1;
    *restartable = *end == 'R';
    if (*restartable) end++;
    snprintf(text, cap, "%s", *end == '\n' ? end + 1 : value);
}

/* ---- joining ------------------------------------------------------------------------------- */

/* Returns the INT/TERM/HUP signal waiting on sigfd, or 0 (a SIGCHLD or SIGUSR1 is consumed). */
static int pending_signal(int sigfd) {
    struct pollfd p = {.fd = sigfd, .events = POLLIN};
    while (poll(&p, 1, 0) > 0) {
        struct signalfd_siginfo si;
        if (read(sigfd, &si, sizeof si) != (ssize_t)sizeof si) return 0;
        if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM || si.ssi_signo == SIGHUP)
            return (int)si.ssi_signo;
        /* not dropped without a word: no rank runs to diagnose before the round starts */
        if (si.ssi_signo == SIGUSR1)
            mtrun_msg("received SIGUSR1 while no ranks run (joining the job or between rounds): "
                      "no diagnosis");
    }
    return 0;
}

static int interrupted(int sig, const char *while_doing) {
    char buf[32];
    mtrun_msg("received %s while %s; stopping", mtrun_signal_name(sig, buf, sizeof buf),
              while_doing);
    return 128 + sig;
}

/* "node N", or "this node" while c10d has not assigned its rank yet. */
static const char *node_name(const mtrun_cluster *c, char *buf, size_t cap) {
    if (c->node < 0) return "this node";
    snprintf(buf, cap, "node %d", c->node);
    return buf;
}

static int connect_until(mtrun_cluster *c, const char *host, double deadline, int sigfd,
                         mt_store **out) {
    char who[32];
    for (;;) {
        /* Short slices so that signals are noticed; never <= 0, which means the default. */
        double left = deadline - mtrun_now();
        double slice = left < JOIN_SLICE_S ? left : JOIN_SLICE_S;
        mt_status st = mt_store_connect(host, c->port, c->job, slice > 0.05 ? slice : 0.05, out);
        if (st == MT_OK) return -1;
        /* Another job or another build: waiting will not help. */
        if (st == MT_ERR_MISMATCH || st == MT_ERR_PROTOCOL || st == MT_ERR_INVALID_ARG) {
            mtrun_msg("%s cannot join the rendezvous store at %s:%d: %s",
                      node_name(c, who, sizeof who), host,
                      c->port, mt_last_error());
            return 1;
        }
        int sig = pending_signal(sigfd);
        if (sig) return interrupted(sig, "connecting to the rendezvous store");
        if (mtrun_now() >= deadline) {
            mtrun_msg("%s could not reach the rendezvous store at %s:%d within %g s (%s; "
                      "is the hosting node's mtrun running with the same port?): %s",
                      node_name(c, who, sizeof who), host, c->port, c->join_timeout, c->join_what, mt_last_error());
            return 1;
        }
    }
}

/* Publishes a non-restartable failure of round `round` unless one stands already. */
static void publish_final_failure(mtrun_cluster *c, int round, int code, const char *text) {
    if (!store_usable(c)) return;
    char value[1200], key[64];
    int n = format_failure(value, sizeof value, code, false, text);
    snprintf(key, sizeof key, "mtrun/r%d/failure", round);
    void *cur = NULL;
    size_t cur_len = 0;
    if (mt_store_compare_set(c->main_conn, key, "", 0, value, (size_t)n, &cur, &cur_len) ==
        MT_OK)
        free(cur);
}

/* Publishes a failure found while joining, so that nodes already waiting stop now rather than
 * at their own timeout. */
static void publish_join_failure(mtrun_cluster *c, int code, const char *text) {
    publish_final_failure(c, c->round, code, text);
}

/* Registers value under key unless another node did first; *cur (malloc'ed, caller frees) is the
 * value that stands: ours or the first node's. False, after saying why, when the store fails. */
static bool register_first(mtrun_cluster *c, const char *key, const char *value, size_t len,
                           void **cur, size_t *cur_len) {
    *cur = NULL;
    *cur_len = 0;
    if (mt_store_compare_set(c->main_conn, key, "", 0, value, len, cur, cur_len) == MT_OK)
        return true;
    mtrun_msg("node %d cannot register with the rendezvous store at %s:%d: %s", c->node, c->addr,
              c->port, mt_last_error());
    return false;
}

static const char *backend_name(int b) { return b == MTRUN_RDZV_C10D ? "c10d" : "static"; }

static int check_config(mtrun_cluster *c) {
    char mine[512], key[] = "mtrun/config", host[256] = "?";
    gethostname(host, sizeof host - 1);
    /* The mtrun's pid and host: with mixed backends, both nodes may carry the same node rank. */
    int n = snprintf(mine, sizeof mine, "%d %d %d %d %d %ld %s", c->nnodes, c->nproc, c->node,
                     c->backend, c->max_restarts, (long)getpid(), host);
    void *cur;
    size_t cur_len;
    if (!register_first(c, key, mine, (size_t)n, &cur, &cur_len)) return 1;
    char theirs[512], their_host[256] = "?";
    copy_value(cur, cur_len, theirs, sizeof theirs);
    int nn = 0, np = 0, who = -1, backend = -1, restarts = -1;
    long their_pid = 0;
    int ok = sscanf(theirs, "%d %d %d %d %d %ld %255s", &nn, &np, &who, &backend, &restarts,
                    &their_pid, their_host) == 7;
    free(cur);
    if (ok && nn == c->nnodes && np == c->nproc && backend == c->backend &&
        restarts == c->max_restarts)
        return -1;
    char text[1024];
    if (ok && nn == c->nnodes && np == c->nproc && backend == c->backend)
        /* A node with fewer restarts would end while the others wait for it in the next round. */
        snprintf(text, sizeof text,
                 "node %d was started with --max_restarts %d but node %d with --max_restarts %d; "
                 "every node of job '%s' needs the same value",
                 c->node, c->max_restarts, who, restarts, c->job);
    else if (ok && nn == c->nnodes && np == c->nproc)
        /* Static ranks and arrival-order ranks would collide: one way for the whole job. */
        snprintf(text, sizeof text,
                 "node %d (mtrun pid %ld on host %s) was started with --rdzv_backend %s but "
                 "node %d (mtrun pid %ld on host %s) with --rdzv_backend %s; every node of job "
                 "'%s' needs the same backend",
                 c->node, (long)getpid(), host, backend_name(c->backend), who, their_pid,
                 their_host, backend_name(backend), c->job);
    else
        snprintf(text, sizeof text,
                 "node %d was started with --nnodes %d --nproc_per_node %d but node %d with "
                 "--nnodes %d --nproc_per_node %d; every node of job '%s' needs the same values",
                 c->node, c->nnodes, c->nproc, who, nn, np, c->job);
    mtrun_msg("%s; stopping the job", text);
    publish_join_failure(c, 1, text);
    return 1;
}

static int claim_node(mtrun_cluster *c) {
    char key[64], mine[512], host[256] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(key, sizeof key, "mtrun/node/%d", c->node);
    int n = snprintf(mine, sizeof mine, "%s %ld", host, (long)getpid());
    void *cur;
    size_t cur_len;
    if (!register_first(c, key, mine, (size_t)n, &cur, &cur_len)) return 1;
    int same = cur_len == (size_t)n && memcmp(cur, mine, (size_t)n) == 0;
    if (!same) {
        char other_host[256] = "?";
        long other_pid = 0;
        char theirs[512];
        copy_value(cur, cur_len, theirs, sizeof theirs);
        sscanf(theirs, "%255s %ld", other_host, &other_pid);
        mtrun_msg("node rank %d of job '%s' is already taken by mtrun pid %ld on host %s; each "
                  "mtrun of a job needs its own --node_rank", c->node, c->job, other_pid,
                  other_host);
    }
    free(cur);
    return same ? -1 : 1;
}

/* c10d: the n-th node to increment the arrival counter takes node rank n-1, so that every node
 * can run the identical command line. A node beyond --nnodes is refused; the job it came too late
 * for is not disturbed. */
static int take_arrival_rank(mtrun_cluster *c) {
    int64_t n = 0;
    if (mt_store_add(c->main_conn, "mtrun/arrivals", 1, &n) != MT_OK) {
        mtrun_msg("cannot take a node rank from the rendezvous store at %s:%d: %s", c->addr,
                  c->port, mt_last_error());
        return 1;
    }
    if (n < 1 || n > c->nnodes) {
        mtrun_msg("job '%s' already has its %d nodes (this mtrun arrived as node number %lld); "
                  "elastic membership is not supported", c->job, c->nnodes, (long long)n);
        return 1;
    }
    c->node = (int)(n - 1);
    return -1;
}

/* Reads each node's host from its claim ("host pid"), for messages naming a lost node; the
 * static backend's store host (node 0) is then named with its host too. */
static void learn_hosts(mtrun_cluster *c) {
    if (!c->hosts) c->hosts = calloc((size_t)c->nnodes, sizeof *c->hosts);
    if (!c->hosts) return;
    for (int n = 0; n < c->nnodes; n++) {
        char key[64], text[512];
        snprintf(key, sizeof key, "mtrun/node/%d", n);
        snprintf(c->hosts[n], sizeof c->hosts[n], "?");
        void *v = NULL;
        size_t len = 0;
        bool found = false;
        if (mt_store_try_get(c->main_conn, key, &v, &len, &found) == MT_OK && found) {
            copy_value(v, len, text, sizeof text);
            sscanf(text, "%63s", c->hosts[n]);
        }
        free(v);
    }
    /* Which node hosts the store: node 0 with static; with c10d, the one that said so. */
    int store_node = c->backend == MTRUN_RDZV_STATIC ? 0 : -1;
    void *v = NULL;
    size_t len = 0;
    bool found = false;
    if (store_node < 0 &&
        mt_store_try_get(c->main_conn, "mtrun/store_node", &v, &len, &found) == MT_OK && found) {
        char text[32];
        copy_value(v, len, text, sizeof text);
        int n = atoi(text);
        if (n >= 0 && n < c->nnodes) store_node = n;
    }
    free(v);
    if (store_node >= 0) {
        snprintf(c->host_label_buf, sizeof c->host_label_buf, "node %d on host %s", store_node,
                 c->hosts[store_node]);
        c->host_label = c->host_label_buf;
    }
}

/* The hosting node records its node rank, so that the others can name it when it is lost. */
static void announce_store_host(mtrun_cluster *c) {
    char value[16];
    int n = snprintf(value, sizeof value, "%d", c->node);
    (void)mt_store_set(c->main_conn, "mtrun/store_node", value, (size_t)n);
}

static int wait_for_nodes(mtrun_cluster *c, double deadline, int sigfd) {
    char **keys = calloc((size_t)c->nnodes, sizeof *keys);
    int code = 1;
    for (int i = 0; keys && i < c->nnodes; i++) {
        keys[i] = malloc(64);
        if (!keys[i]) goto done;
        /* The first round waits for the node claims; a restart for each node's arrival in it. */
        if (c->round == 0)
            snprintf(keys[i], 64, "mtrun/node/%d", i);
        else
            round_key(c, keys[i], 64, "joined", i);
    }
    if (!keys) goto done;
    for (;;) {
        double left = deadline - mtrun_now();
        if (left < 0.001) left = 0.001;
        mt_status st = mt_store_wait(c->main_conn, (const char *const *)keys, c->nnodes,
                                     left < JOIN_SLICE_S ? left : JOIN_SLICE_S);
        if (st == MT_OK) {
            code = -1;
            goto done;
        }
        if (st != MT_ERR_TIMEOUT) {
            mtrun_msg("lost the rendezvous store at %s:%d (%s) while waiting for the "
                      "other nodes: %s", c->addr, c->port, c->host_label, mt_last_error());
            goto done;
        }
        void *fail = NULL;
        size_t fail_len = 0;
        bool found = false, restartable;
        char fkey[64];
        round_key(c, fkey, sizeof fkey, "failure", -1);
        if (mt_store_try_get(c->main_conn, fkey, &fail, &fail_len, &found) == MT_OK &&
            found) {
            char text[1024];
            parse_failure(fail, fail_len, &code, &restartable, text, sizeof text);
            free(fail);
            mtrun_msg("%s; stopping the job", text);
            goto done;
        }
        int sig = pending_signal(sigfd);
        if (sig) {
            code = interrupted(sig, "waiting for the other nodes");
            goto done;
        }
        if (mtrun_now() >= deadline) break;
    }
    /* Name the nodes that never came. */
    char missing[512] = "";
    int nmissing = 0;
    for (int i = 0; i < c->nnodes; i++) {
        bool found = false;
        void *v = NULL;
        size_t len = 0;
        if (mt_store_try_get(c->main_conn, keys[i], &v, &len, &found) == MT_OK && !found) {
            size_t used = strlen(missing);
            if (nmissing < 32)
                snprintf(missing + used, sizeof missing - used, "%s%d", nmissing ? ", " : "", i);
            else if (nmissing == 32)
                snprintf(missing + used, sizeof missing - used, ", ...");
            nmissing++;
        }
        free(v);
    }
    char text[1024];
    if (c->round == 0)
        snprintf(text, sizeof text, "node%s %s never joined job '%s' within %g s (%s); "
                 "check that every node runs mtrun with --master_addr %s --master_port %d",
                 nmissing == 1 ? "" : "s", nmissing ? missing : "?", c->job, c->join_timeout,
                 c->join_what, c->addr, c->port);
    else
        snprintf(text, sizeof text, "node%s %s never joined restart %d of job '%s' within %g s "
                 "(%s); its mtrun has probably ended", nmissing == 1 ? "" : "s",
                 nmissing ? missing : "?", c->round, c->job, c->join_timeout, c->join_what);
    mtrun_msg("%s; stopping the job", text);
    publish_join_failure(c, 1, text);
done:
    for (int i = 0; keys && i < c->nnodes; i++) free(keys[i]);
    free(keys);
    return code;
}

/* ---- running ------------------------------------------------------------------------------- */

static bool hb_sleep(mtrun_cluster *c, double seconds) {
    struct timespec ts = mt_clock_deadline(seconds); /* c->cv runs on CLOCK_MONOTONIC */
    pthread_mutex_lock(&c->mu);
    while (!c->stop && pthread_cond_timedwait(&c->cv, &c->mu, &ts) != ETIMEDOUT) {
    }
    bool stop = c->stop;
    pthread_mutex_unlock(&c->mu);
    return !stop;
}

/* Reads an integer key; a missing key reads as 0. Returns false on a store error. */
static bool read_counter(mt_store *s, const char *key, int64_t *v, bool *found) {
    void *val = NULL;
    size_t len = 0;
    *found = false;
    if (mt_store_try_get(s, key, &val, &len, found) != MT_OK) return false;
    char text[32];
    copy_value(val, len, text, sizeof text);
    *v = *found ? strtoll(text, NULL, 10) : 0;
    free(val);
    return true;
}

static void *heartbeat_main(void *arg) {
    mtrun_cluster *c = arg;
    char key[64];
    round_key(c, key, sizeof key, "hb", c->node);
    do {
        int64_t ignored;
        if (mt_store_add(c->hb_conn, key, 1, &ignored) != MT_OK) goto lost;
        double now = mtrun_now();
        pthread_mutex_lock(&c->mu);
        c->last_ok = now;
        pthread_mutex_unlock(&c->mu);
        bool settled = true;
        for (int n = 0; n < c->nnodes; n++) {
            if (n == c->node || c->left[n] || c->lost[n]) continue;
            char k[64];
            int64_t v;
            bool found;
            round_key(c, k, sizeof k, "exit", n);
            if (!read_counter(c->hb_conn, k, &v, &found)) goto lost;
            if (found) {
                c->left[n] = 1;
                continue;
            }
            round_key(c, k, sizeof k, "hb", n);
            if (!read_counter(c->hb_conn, k, &v, &found)) goto lost;
            now = mtrun_now();
            if (v != c->hb_seen[n]) {
                c->hb_seen[n] = v;
                c->hb_changed[n] = now;
            } else if (now - c->hb_changed[n] > c->timeout) {
                c->lost[n] = 1;
                pthread_mutex_lock(&c->mu);
                set_event_locked(c, 1, true, false,
                                 "node %d (host %s) stopped answering (no heartbeat for %g s)", n,
                                 c->hosts ? c->hosts[n] : "?", c->timeout);
                pthread_mutex_unlock(&c->mu);
                continue;
            }
            settled = false;
        }
        if (settled) {
            pthread_mutex_lock(&c->mu);
            if (!c->settled) {
                c->settled = true;
                notify(c);
            }
            pthread_mutex_unlock(&c->mu);
        }
    } while (hb_sleep(c, 1.0));
    return NULL;
lost:
    pthread_mutex_lock(&c->mu);
    store_lost_locked(c, mt_last_error());
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static void *watcher_main(void *arg) {
    mtrun_cluster *c = arg;
    char wake[64], failure[64];
    round_key(c, wake, sizeof wake, "wake", c->node);
    round_key(c, failure, sizeof failure, "failure", -1);
    const char *keys[2] = {failure, wake};
    for (;;) {
        void *v = NULL;
        size_t len = 0;
        int which = -1;
        mt_status st = mt_store_wait_any(c->watch_conn, keys, 2, WATCH_SLICE_S, &which, &v, &len);
        if (st == MT_ERR_TIMEOUT) continue;
        pthread_mutex_lock(&c->mu);
        if (st == MT_OK && which == 0) {
            int code;
            bool restartable;
            char text[1024];
            parse_failure(v, len, &code, &restartable, text, sizeof text);
            set_event_locked(c, code, false, restartable, "%s", text);
        } else if (st != MT_OK) {
            store_lost_locked(c, mt_last_error());
        }
        c->watch_done = true;
        pthread_cond_broadcast(&c->cv); /* stop_watcher may be waiting for this */
        pthread_mutex_unlock(&c->mu);
        free(v);
        return NULL;
    }
}

static int start_round(mtrun_cluster *c);

int mtrun_cluster_join(mtrun_options *o, int port, double join_s, double timeout_s, int sigfd,
                       mtrun_cluster **out) {
    mtrun_cluster *c = calloc(1, sizeof *c);
    if (!c) {
        mtrun_msg("out of memory");
        return 1;
    }
    c->nnodes = o->nnodes;
    c->node = o->node_rank;
    c->nproc = o->nproc_per_node;
    c->backend = (int)o->rdzv_backend;
    c->max_restarts = o->max_restarts;
    c->port = port;
    c->timeout = timeout_s;
    c->join_timeout = join_s;
    c->host_label = o->rdzv_backend == MTRUN_RDZV_STATIC ? "node 0" : "the hosting node";
    c->join_what = o->join_timeout >= 0 ? "--rdzv_conf join_timeout" : "MT_TIMEOUT_S";
    snprintf(c->addr, sizeof c->addr, "%s", o->master_addr);
    snprintf(c->job, sizeof c->job, "%s", o->rdzv_id);
    c->notify_r = c->notify_w = -1;
    pthread_mutex_init(&c->mu, NULL);
    if (mt_cond_init_monotonic(&c->cv) != 0) {
        mtrun_msg("cannot create the cluster's condition variable");
        pthread_mutex_destroy(&c->mu);
        free(c);
        return 1;
    }

    /* The hosting node talks to its own server at the address it listens on: the master
     * address may resolve elsewhere on this host (loopback, another interface). */
    const char *host = o->hosts_store ? o->store_bind : c->addr;
    double deadline = mtrun_now() + join_s;
    int code = connect_until(c, host, deadline, sigfd, &c->main_conn);
    if (code < 0 && c->node < 0) {
        code = take_arrival_rank(c);
        if (code < 0) o->node_rank = c->node;
    }
    if (code < 0) code = check_config(c);
    /* Before the claim: whoever sees every claim can then name the store's node too. */
    if (code < 0 && o->hosts_store) announce_store_host(c);
    if (code < 0) code = claim_node(c);
    if (code < 0) code = wait_for_nodes(c, deadline, sigfd);
    if (code < 0) learn_hosts(c);
    /* The store is known to be up now: these connections need no long deadline. */
    if (code < 0) code = connect_until(c, host, mtrun_now() + 10, sigfd, &c->hb_conn);
    if (code < 0) code = connect_until(c, host, mtrun_now() + 10, sigfd, &c->watch_conn);
    if (code >= 0) {
        mtrun_cluster_close(c);
        return code;
    }
    /* A store host that stopped answering while its kernel still acknowledges (a hung or stopped
     * mtrun) is noticed by the heartbeat's unanswered request in half of MT_TIMEOUT_S, within the
     * time the other nodes give it; the kernel's keepalive covers a host that vanished. */
    double answer = timeout_s / 2 > 2.0 ? timeout_s / 2 : timeout_s < 2.0 ? timeout_s : 2.0;
    (void)mt_store_set_answer_limit(c->hb_conn, answer);
    (void)mt_store_set_answer_limit(c->main_conn, answer);
    code = start_round(c);
    if (code >= 0) {
        mtrun_cluster_close(c);
        return code;
    }
    *out = c;
    return -1;
}

/* Starts the heartbeat and the watcher of the current round. Returns -1, or 1 after saying why. */
static int start_round(mtrun_cluster *c) {
    int p[2];
    c->hb_seen = calloc((size_t)c->nnodes, sizeof *c->hb_seen);
    c->hb_changed = calloc((size_t)c->nnodes, sizeof *c->hb_changed);
    c->left = calloc((size_t)c->nnodes, 1);
    c->lost = calloc((size_t)c->nnodes, 1);
    if (!c->hb_seen || !c->hb_changed || !c->left || !c->lost ||
        (c->notify_r < 0 && pipe2(p, O_CLOEXEC | O_NONBLOCK))) {
        mtrun_msg("cannot set up the heartbeat: %s", strerror(errno ? errno : ENOMEM));
        return 1;
    }
    if (c->notify_r < 0) {
        c->notify_r = p[0];
        c->notify_w = p[1];
    }
    double now = mtrun_now();
    c->last_ok = now;
    for (int n = 0; n < c->nnodes; n++) {
        c->hb_seen[n] = -1;
        c->hb_changed[n] = now;
    }
    if (pthread_create(&c->hb_thread, NULL, heartbeat_main, c) != 0) {
        mtrun_msg("cannot start the heartbeat thread");
        return 1;
    }
    c->hb_started = true;
    if (pthread_create(&c->watch_thread, NULL, watcher_main, c) != 0) {
        mtrun_msg("cannot start the failure watcher thread");
        return 1;
    }
    c->watch_started = true;
    return -1;
}

int mtrun_cluster_fd(const mtrun_cluster *c) { return c->notify_r; }

bool mtrun_cluster_check(mtrun_cluster *c, mtrun_cluster_event *ev) {
    char buf[64];
    while (read(c->notify_r, buf, sizeof buf) > 0) {
    }
    pthread_mutex_lock(&c->mu);
    /* A heartbeat stuck in a store call (no answer, connection not closed) counts as lost too. */
    double silent = mtrun_now() - c->last_ok;
    if (!c->have_event && silent > c->timeout + 1.0) {
        char why[128];
        snprintf(why, sizeof why, "no answer for %.0f s", silent);
        store_lost_locked(c, why);
    }
    bool fresh = c->have_event && !c->event_taken;
    if (fresh) {
        c->event_taken = true;
        *ev = c->event;
    }
    pthread_mutex_unlock(&c->mu);
    return fresh;
}

bool mtrun_cluster_settled(mtrun_cluster *c) {
    pthread_mutex_lock(&c->mu);
    bool s = c->settled;
    pthread_mutex_unlock(&c->mu);
    return s;
}

void mtrun_cluster_publish_failure(mtrun_cluster *c, int *code, bool *restartable, char *text,
                                   size_t cap) {
    if (!store_usable(c)) return;
    char value[1200], key[64];
    int n = format_failure(value, sizeof value, *code, *restartable, text);
    round_key(c, key, sizeof key, "failure", -1);
    void *cur = NULL;
    size_t cur_len = 0;
    if (mt_store_compare_set(c->main_conn, key, "", 0, value, (size_t)n, &cur, &cur_len) != MT_OK)
        return;
    if (cur_len != (size_t)n || memcmp(cur, value, (size_t)n) != 0)
        parse_failure(cur, cur_len, code, restartable, text, cap);
    free(cur);
}

void mtrun_cluster_leave(mtrun_cluster *c, int code) {
    if (!store_usable(c)) return;
    char key[64], value[16];
    round_key(c, key, sizeof key, "exit", c->node);
    int n = snprintf(value, sizeof value, "%d", code);
    (void)mt_store_set(c->main_conn, key, value, (size_t)n);
}

void mtrun_cluster_decline_next_round(mtrun_cluster *c, int code, const char *why) {
    char text[1024];
    snprintf(text, sizeof text, "node %d does not take part in restart %d of job '%s': %s",
             c->node, c->round + 1, c->job, why);
    publish_final_failure(c, c->round + 1, code > 0 && code < 256 ? code : 1, text);
}

/* Wakes the watcher through its own key and joins it, giving up after a few seconds if the store
 * no longer answers. Returns true when the watcher is gone. */
static bool stop_watcher(mtrun_cluster *c) {
    if (!c->watch_started) return true;
    pthread_mutex_lock(&c->mu);
    bool done = c->watch_done, gone = c->store_gone;
    pthread_mutex_unlock(&c->mu);
    /* A store that stopped answering will not wake the watcher either: leave it at once. */
    if (!done && gone) return false;
    if (!done && c->main_conn) {
        char wake[64];
        round_key(c, wake, sizeof wake, "wake", c->node);
        (void)mt_store_set(c->main_conn, wake, "1", 1);
    }
    struct timespec until = mt_clock_deadline(3.0);
    pthread_mutex_lock(&c->mu);
    while (!c->watch_done && pthread_cond_timedwait(&c->cv, &c->mu, &until) != ETIMEDOUT) {
    }
    done = c->watch_done;
    pthread_mutex_unlock(&c->mu);
    if (!done) return false;
    pthread_join(c->watch_thread, NULL); /* it has returned, or is about to */
    c->watch_started = false;
    return true;
}

int mtrun_cluster_next_round(mtrun_cluster *c, int sigfd) {
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    c->closing = true; /* what this round's threads still find is no longer news */
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->hb_started) pthread_join(c->hb_thread, NULL);
    c->hb_started = false;
    if (!stop_watcher(c)) {
        mtrun_msg("the rendezvous store at %s:%d (%s) stopped answering; cannot restart the job",
                  c->addr, c->port, c->host_label);
        return 1;
    }
    free(c->hb_seen);
    free(c->hb_changed);
    free(c->left);
    free(c->lost);
    c->hb_seen = NULL;
    c->hb_changed = NULL;
    c->left = c->lost = NULL;
    char buf[64];
    while (read(c->notify_r, buf, sizeof buf) > 0) {
    }
    c->stop = c->closing = c->have_event = c->event_taken = c->settled = c->watch_done = false;
    c->round++;
    char key[64];
    round_key(c, key, sizeof key, "joined", c->node);
    if (mt_store_set(c->main_conn, key, "1", 1) != MT_OK) {
        mtrun_msg("lost the rendezvous store at %s:%d (%s) while joining restart %d: %s", c->addr,
                  c->port, c->host_label, c->round, mt_last_error());
        return 1;
    }
    int code = wait_for_nodes(c, mtrun_now() + c->join_timeout, sigfd);
    return code >= 0 ? code : start_round(c);
}

void mtrun_cluster_close(mtrun_cluster *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    c->closing = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->hb_started) pthread_join(c->hb_thread, NULL);
    c->hb_started = false;
    bool watcher_gone = stop_watcher(c);
    if (c->hb_conn) mt_store_close(c->hb_conn);
    if (c->main_conn) mt_store_close(c->main_conn);
    c->hb_conn = c->main_conn = NULL;
    if (!watcher_gone) {
        mtrun_abandoned_cluster = c;
        return;
    }
    if (c->watch_conn) mt_store_close(c->watch_conn);
    if (c->notify_r >= 0) close(c->notify_r);
    if (c->notify_w >= 0) close(c->notify_w);
    free(c->hb_seen);
    free(c->hb_changed);
    free(c->left);
    free(c->lost);
    free(c->hosts);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

mt_store *mtrun_cluster_store(mtrun_cluster *c) { return c && store_usable(c) ? c->main_conn : NULL; }

int mtrun_cluster_nnodes(const mtrun_cluster *c) { return c->nnodes; }
