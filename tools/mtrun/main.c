/* mtrun: starts and supervises the ranks of one node (like `torchrun --no-python`); node 0 also
 * hosts the job's rendezvous store. See docs/mtrun.md. */
#include "binding.h"
#include "cluster.h"
#include "endpoint.h"
#include "flightrec.h"
#include "fr_report.h"
#include "logfiles.h"
#include "msg.h"
#include "options.h"
#include "restart.h"
#include "security.h"

#include "core/env.h"
#include "store/store_internal.h" /* mt_store_server_start_opts */

#include <meshtrain/store.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

/* mkdir -p */
static int make_dirs(const char *dir) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST) return -1;
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

static pthread_t main_thread;

/* Runs on a thread that does not block the signal: sends it on to the main thread, where it
 * stays pending (blocked) for run()'s signalfd. Only pthread_kill, which is async-signal-safe. */
static void to_main_thread(int sig) {
    int saved = errno;
    pthread_kill(main_thread, sig);
    errno = saved;
}

/* mtrun takes its signals from a signalfd on the main thread, with them blocked (run()). A thread
 * made before main() (OpenBLAS makes its pool when the library loads) blocks none of them, and the
 * kernel gives a process's signal to a thread that does not block it: there SIGTERM, SIGINT,
 * SIGHUP or SIGUSR1 took its default action and ended mtrun at once (its ranks orphaned, no
 * diagnosis), and a SIGCHLD was lost. A handler on such a thread sends the signal on instead. The
 * main thread blocks them from here on, also before run() (a SIGUSR1 during start-up), and the
 * threads it makes inherit that; ranks get the default dispositions back (spawn.c). */
static void forward_signals(void) {
    static const int forwarded[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1};
    main_thread = pthread_self();
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++) sigaddset(&set, forwarded[i]);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    struct sigaction sa = {.sa_handler = to_main_thread, .sa_flags = SA_RESTART};
    sigfillset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++)
        sigaction(forwarded[i], &sa, NULL);
}

/* Which mtrun hosts the store. static: node rank 0. c10d: --rdzv_conf is_host when given,
 * else the node whose address (--local_addr, else its interfaces and loopback) the endpoint's
 * host is. A single node always hosts it, since nobody else would. */
static bool decide_hosting(const mtrun_options *o) {
    if (o->nnodes == 1) return true;
    if (o->rdzv_backend == MTRUN_RDZV_STATIC) return o->node_rank == 0;
    if (o->is_host >= 0) return o->is_host == 1;
    return mtrun_endpoint_is_local(o->master_addr, o->local_addr);
}

/* c10d nodes that found the endpoint to be theirs race for the port when they share a machine;
 * the losers become clients. Forced hosting (is_host=true) and static keep the error. */
static bool c10d_may_leave_hosting(const mtrun_options *o) {
    return o->rdzv_backend == MTRUN_RDZV_C10D && o->nnodes > 1 && o->is_host < 0;
}

/* Everything after option parsing and binding plans: the store, the cluster and the job. */
static int run(mtrun_options *o, mtrun_binding *binding) {
    /* Signals are blocked before any thread exists (the store's included) so that only the
     * signalfd sees them; a closed stdout must not kill mtrun and orphan the ranks. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    /* A dropped ssh session: stop the job and tell the other nodes, as for SIGTERM, rather than
     * die by the default action with the ranks orphaned and nobody told. */
    sigaddset(&set, SIGHUP);
    /* A diagnosis of the running job from the flight recorder (fr_report.h). */
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    int sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd < 0) {
        mtrun_msg("signalfd failed: %s", strerror(errno));
        return 1;
    }
    /* Orphans of a rank come back to us, so their process group can be watched to the end. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        mtrun_msg("cannot become a child subreaper (%s); leftovers of ranks may escape",
                  strerror(errno));

    double timeout, grace;
    if (mt_timeout_from_env(&timeout) != MT_OK ||
        mt_env_seconds("MT_KILL_GRACE_S", 0, 3600, 3.0, "seconds between SIGTERM and SIGKILL",
                       &grace) != MT_OK) {
        mtrun_msg("%s", mt_last_error());
        close(sigfd);
        return 2;
    }

    mt_store_server *server = NULL;
    int port = o->master_port;
    if (o->hosts_store) {
        int bad = mtrun_security_store_bind(o);
        if (bad >= 0) {
            close(sigfd);
            return bad;
        }
        mt_store_server_opts so = {.bind_addr = o->store_listen, .port = o->master_port,
                                   .job_id = o->rdzv_id,
                                   .max_clients = mtrun_security_max_clients(o)};
        int listen_err = 0;
        if (mt_store_server_start_opts(&so, &server, &listen_err) != MT_OK) {
            if (listen_err != EADDRINUSE || !c10d_may_leave_hosting(o)) {
                mtrun_msg("cannot host the rendezvous store on port %d: %s", o->master_port,
                          mt_last_error());
                return 1;
            }
            /* The port is taken: another mtrun of this machine hosts it already (several nodes
             * on one machine), join as a client. A port held by anything else fails the
             * connection, which says so. Any other failure to host is this node's error. */
            o->hosts_store = false;
        } else {
            port = mt_store_server_port(server);
        }
    }

    mtrun_cluster *cluster = NULL;
    int code = -1;
    double join = o->join_timeout >= 0 ? o->join_timeout : timeout;
    if (o->nnodes > 1) code = mtrun_cluster_join(o, port, join, timeout, sigfd, &cluster);
    if (code < 0) code = mtrun_run_rounds(o, port, cluster, binding, sigfd, timeout, grace);
    mtrun_cluster_close(cluster);
    if (server) mt_store_server_stop(server);
    close(sigfd);
    return code;
}

/* mtrun --diagnose[=PID] */
static int diagnose_command(const char *arg) {
    const char *v = arg + strlen("--diagnose");
    if (*v == '\0') return mtrun_fr_diagnose_local(0);
    char *end;
    long pid = *v == '=' ? strtol(v + 1, &end, 10) : -1;
    if (*v != '=' || end == v + 1 || *end || pid <= 0) {
        mtrun_msg("invalid %s: expected --diagnose or --diagnose=PID (an mtrun's pid)", arg);
        return 2;
    }
    return mtrun_fr_diagnose_local(pid);
}

int main(int argc, char **argv) {
    if (argc == 2 && strncmp(argv[1], "--diagnose", 10) == 0) return diagnose_command(argv[1]);
    forward_signals();
    mtrun_options o;
    int r = mtrun_parse_options(argc, argv, &o);
    if (r != MTRUN_PARSE_RUN) return r;

    if (o.log_dir && make_dirs(o.log_dir) != 0) {
        mtrun_msg("cannot create the log directory %s: %s", o.log_dir, strerror(errno));
        return 1;
    }
    r = mtrun_logs_prepare(&o, &o.logs);
    if (r != 0) return r;
    /* The topology is read before any thread exists, and a bad MT_TOPO_FILE stops this node
     * before it joins the job. */
    o.hosts_store = decide_hosting(&o);
    r = mtrun_security_prepare(&o);
    if (r >= 0) return r;
    mtrun_binding *binding = NULL;
    r = mtrun_binding_prepare(&o, &binding);
    if (r != 0) return r;
    r = mtrun_fr_create(o.nproc_per_node, &o.fr);
    if (r == 0) r = run(&o, binding);
    mtrun_fr_destroy(o.fr);
    mtrun_binding_close(binding);
    mtrun_logs_free(o.logs);
    return r;
}
