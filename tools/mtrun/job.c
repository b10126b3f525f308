/* One event loop, no busy waiting: poll() on the signalfd (SIGCHLD, SIGHUP, SIGINT, SIGTERM),
 * the cluster's notification pipe and the ranks' output pipes. Timeouts only tick while stopping
 * (to escalate SIGTERM to SIGKILL, then to give up after a bounded wait) and, for multi-node
 * jobs, once a second to notice a store that stopped answering.
 *
 * mtrun is a child subreaper: the children a rank leaves behind are re-parented to mtrun, so
 * their deaths wake the loop and a rank's process group is known to be empty without polling. */
#include "job.h"

#include "flightrec.h"
#include "fr_report.h"
#include "logfiles.h"
#include "msg.h"
#include "output.h"
#include "spawn.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#define STOP_TICK_S 0.25       /* while stopping, how often groups are checked for leftovers */
#define AFTER_KILL_S 5.0       /* after SIGKILL, how long to wait for processes to vanish */

typedef enum { RUNNING, STOPPING, DRAINING, FINISHED } phase;

typedef struct rank_slot {
    pid_t pid;     /* also the process group id; 0 when never started */
    bool alive;    /* not reaped yet */
    int local, global;
    mtrun_stream out, err;
} rank_slot;

typedef struct job {
    const mtrun_options *o;
    mtrun_cluster *cluster;
    mtrun_binding *binding;
    rank_slot *ranks;
    int n;
    phase ph;
    bool failed;         /* the round's first failure is known */
    bool restartable;    /* it was a rank's failure: --max_restarts may start another round */
    bool signaled;       /* mtrun was told to stop: no other round */
    char signal_name[32]; /* which signal, for the other nodes */
    bool declined;       /* the other nodes were told that this node ends with this round */
    int round;           /* restarts before this round */
    char failure[1024];  /* the round's first failure, for the final message */
    int code;            /* mtrun's exit code */
    int port;            /* the store's port: MASTER_PORT for the ranks */
    double grace, timeout;
    double deadline;     /* STOPPING: SIGKILL (then give-up) time; DRAINING: end of the wait */
    bool killed;
} job;

/* Signals every rank's process group, exited ranks included: their children must go too. */
static void stop_ranks(job *j, int sig) {
    for (int i = 0; i < j->n; i++)
        if (j->ranks[i].pid > 0) kill(-j->ranks[i].pid, sig);
    if (j->ph == RUNNING) {
        j->ph = STOPPING;
        j->deadline = mtrun_now() + j->grace;
    }
}

/* Another round follows this one. */
static bool will_restart(const job *j) {
    return j->failed && j->restartable && !j->signaled && j->round < j->o->max_restarts;
}

/* This node ends with this round: tells the nodes that go on why, so that they do not wait for
 * it. Once; only when the outcome here is final. */
static void decline_next_round(job *j) {
    if (!j->cluster || j->declined || will_restart(j)) return;
    j->declined = true;
    char why[1200];
    if (j->signaled)
        snprintf(why, sizeof why, "it received %s", j->signal_name);
    else if (j->failed && j->restartable)
        snprintf(why, sizeof why, "it has no restart left (--max_restarts %d)",
                 j->o->max_restarts);
    else if (j->failed)
        snprintf(why, sizeof why, "it stopped after: %s", j->failure);
    else
        snprintf(why, sizeof why, "its ranks all exited with code 0 and its mtrun has ended");
    mtrun_cluster_decline_next_round(j->cluster, j->code ? j->code : 1, why);
}

static void rank_pids(const job *j, pid_t *pids) {
    for (int i = 0; i < j->n; i++) pids[i] = j->ranks[i].alive ? j->ranks[i].pid : 0;
}

/* Records the round's first failure (later ones are ignored), stops the ranks with sig, agrees
 * on it with the other nodes when publish is set and prints the line. The local ranks come first:
 * the store may be slow or gone (its host lost), and waiting for it must not delay them. */
static void fail(job *j, int code, const char *text, bool publish, bool restartable, int sig) {
    if (j->failed) return;
    j->failed = true;
    /* A rank's failure, not a signal to mtrun or a launch error: worth a diagnosis. The local
     * rings are read before the ranks are stopped (pids and states as the failure left them);
     * gathering the other nodes' waits until the failure is published. */
    /* Node 0 whose ranks are done (DRAINING) gathers the others' too: they publish theirs. */
    bool diagnose = restartable && (j->ph == RUNNING || j->ph == DRAINING) && j->o->fr;
    pid_t *pids = diagnose ? calloc((size_t)j->n, sizeof *pids) : NULL;
    if (pids) rank_pids(j, pids);
    if (j->ph == RUNNING) stop_ranks(j, sig);
    else if (j->ph == DRAINING) j->ph = FINISHED; /* nothing left to stop here */
    char line[1024];
    snprintf(line, sizeof line, "%s", text);
    if (j->cluster && publish)
        mtrun_cluster_publish_failure(j->cluster, &code, &restartable, line, sizeof line);
    j->code = code;
    j->restartable = restartable;
    snprintf(j->failure, sizeof j->failure, "%s", line);
    mtrun_msg("%s; stopping the job", line);
    if (pids) {
        char id[32];
        snprintf(id, sizeof id, "f%d", j->round);
        mtrun_fr_report(j->o, j->cluster, pids, id, line);
        free(pids);
    }
}

static void describe_exit(const job *j, const rank_slot *r, int status, char *text, size_t cap,
                          int *code) {
    char sigbuf[32];
    int n = snprintf(text, cap, "rank %d (node %d, local rank %d) ", r->global, j->o->node_rank,
                     r->local);
    if (n < 0 || (size_t)n >= cap) n = 0;
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        snprintf(text + n, cap - (size_t)n, "was killed by signal %d (%s)", sig,
                 mtrun_signal_name(sig, sigbuf, sizeof sigbuf));
        *code = 128 + sig;
    } else {
        *code = WEXITSTATUS(status);
        snprintf(text + n, cap - (size_t)n, "exited with code %d", *code);
    }
}

static void reap(job *j) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) return; /* 0: nothing more now; -1: no children at all */
        for (int i = 0; i < j->n; i++) {
            rank_slot *r = &j->ranks[i];
            if (r->pid != pid || !r->alive) continue;
            r->alive = false;
            mtrun_stream_close(&r->out);
            mtrun_stream_close(&r->err);
            bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (!ok && j->ph == RUNNING) {
                char text[512];
                int code;
                describe_exit(j, r, status, text, sizeof text, &code);
                fail(j, code, text, true, true, SIGTERM);
            }
        }
        /* any other pid: a leftover child of a rank, re-parented to us */
    }
}

static void on_signal(job *j, int sig) {
    char buf[32];
    if (sig == SIGUSR1) {
        /* a diagnosis of the running job; it goes on. While stopping, the other nodes do not
         * answer (and a failure's diagnosis came already); a node whose ranks are done
         * (DRAINING) still reads their rings and asks the nodes that run. */
        if (!j->o->fr) {
            mtrun_msg("received SIGUSR1, but the flight recorder is off (MT_FLIGHT_RECORDER=0): "
                      "no diagnosis");
            return;
        }
        if (j->ph != RUNNING && j->ph != DRAINING) {
            mtrun_msg("received SIGUSR1 while the job is stopping: no diagnosis");
            return;
        }
        pid_t *pids = calloc((size_t)j->n, sizeof *pids);
        if (!pids) {
            mtrun_msg("received SIGUSR1, but out of memory for the diagnosis");
            return;
        }
        rank_pids(j, pids);
        mtrun_fr_request(j->o, j->cluster, pids);
        free(pids);
        return;
    }
    if (j->ph == STOPPING) {
        /* Asked while already stopping: do not make the user wait for the grace period. */
        mtrun_msg("received %s while stopping the job; killing the ranks now",
                  mtrun_signal_name(sig, buf, sizeof buf));
        j->signaled = true; /* told to stop: no restart either */
        snprintf(j->signal_name, sizeof j->signal_name, "%s",
                 mtrun_signal_name(sig, buf, sizeof buf));
        stop_ranks(j, SIGKILL);
        j->killed = true;
        j->deadline = mtrun_now() + AFTER_KILL_S;
        return;
    }
    char text[256];
    snprintf(text, sizeof text, "node %d received %s", j->o->node_rank,
             mtrun_signal_name(sig, buf, sizeof buf));
    /* The signal is forwarded as it is (a rank may treat SIGINT differently from SIGTERM);
     * SIGHUP (mtrun's terminal or ssh session went away) stops the ranks as SIGTERM would. */
    j->signaled = true;
    snprintf(j->signal_name, sizeof j->signal_name, "%s",
             mtrun_signal_name(sig, buf, sizeof buf));
    fail(j, 128 + sig, text, true, false, sig == SIGHUP ? SIGTERM : sig);
    if (j->ph == DRAINING) j->ph = FINISHED;
}

static bool groups_empty(const job *j) {
    for (int i = 0; i < j->n; i++) {
        const rank_slot *r = &j->ranks[i];
        if (r->alive) return false;
        if (r->pid > 0 && (kill(-r->pid, 0) == 0 || errno != ESRCH)) return false;
    }
    return true;
}

static bool all_reaped(const job *j) {
    for (int i = 0; i < j->n; i++)
        if (j->ranks[i].alive) return false;
    return true;
}

/* The local ranks are all gone: say so to the other nodes and decide what comes next. The node
 * that hosts the store keeps the store up until the other nodes have left (or are lost), so that none of them takes a
 * finished node 0 for a dead one, and each can still read the first failure. */
static void ranks_done(job *j) {
    for (int i = 0; i < j->n; i++) {
        mtrun_stream_close(&j->ranks[i].out);
        mtrun_stream_close(&j->ranks[i].err);
    }
    if (!j->cluster) {
        j->ph = FINISHED;
        return;
    }
    /* Before leaving: a node that restarts may read this as soon as it sees the exit key. */
    if (j->failed) decline_next_round(j);
    /* Even before a restart: a node that does not restart waits for every node's exit key. */
    mtrun_cluster_leave(j->cluster, j->code);
    if (will_restart(j)) {
        j->ph = FINISHED;
        return;
    }
    if (j->o->hosts_store && !mtrun_cluster_settled(j->cluster)) {
        /* After a success, other nodes may legitimately run much longer: the heartbeat bounds
         * the wait (a dead node is declared lost after MT_TIMEOUT_S). After a failure the others
         * are only stopping, and MT_TIMEOUT_S bounds the wait as well. */
        j->ph = DRAINING;
        j->deadline = j->failed ? mtrun_now() + j->timeout : -1;
    } else {
        j->ph = FINISHED;
    }
}

static void on_timer(job *j) {
    double now = mtrun_now();
    if (j->ph == STOPPING && now >= j->deadline) {
        if (!j->killed) {
            stop_ranks(j, SIGKILL);
            j->killed = true;
            j->deadline = now + AFTER_KILL_S;
        } else if (all_reaped(j)) {
            mtrun_msg("some processes of the job's ranks survived SIGKILL (left their process "
                      "group?); giving up on them");
            ranks_done(j);
        } else if (now >= j->deadline + AFTER_KILL_S) {
            /* A rank that SIGKILL has not ended in 2 x AFTER_KILL_S is stuck in the kernel
             * (uninterruptible I/O, a hung driver): waiting longer helps nobody. */
            char who[256] = "";
            size_t used = 0;
            for (int i = 0; i < j->n && used + 16 < sizeof who; i++)
                if (j->ranks[i].alive) {
                    int w = snprintf(who + used, sizeof who - used, "%s%d", used ? ", " : "",
                                     j->ranks[i].global);
                    if (w > 0) used += (size_t)w;
                }
            mtrun_msg("rank%s %s did not exit within %g s of SIGKILL (stuck in the kernel?); "
                      "leaving %s behind", strchr(who, ',') ? "s" : "", who, 2 * AFTER_KILL_S,
                      strchr(who, ',') ? "them" : "it");
            ranks_done(j);
        }
    }
    if (j->ph == DRAINING && j->deadline >= 0 && now >= j->deadline) {
        mtrun_msg("stopped waiting for the other nodes to finish after %g s (MT_TIMEOUT_S)",
                  j->timeout);
        j->ph = FINISHED;
    }
}

static void on_cluster(job *j) {
    /* Node 0 prints every diagnosis, also once its own ranks are done (DRAINING) */
    if ((j->ph == RUNNING || j->ph == DRAINING) && j->o->fr) {
        pid_t *pids = calloc((size_t)j->n, sizeof *pids);
        if (pids) {
            rank_pids(j, pids);
            mtrun_fr_poll_requests(j->o, j->cluster, pids);
            free(pids);
        }
    }
    mtrun_cluster_event ev;
    if (mtrun_cluster_check(j->cluster, &ev)) {
        if (j->ph == RUNNING || (j->ph == DRAINING && !j->failed))
            fail(j, ev.code, ev.text, ev.publish, ev.restartable, SIGTERM);
    }
    if (j->ph == DRAINING && mtrun_cluster_settled(j->cluster)) j->ph = FINISHED;
}

static void start_ranks(job *j) {
    const mtrun_options *o = j->o;
    int code = 0;
    char why[256], text[640];
    /* The node's first rank's line: "not bound (...)" alike on every rank is said once. */
    char first_line[2048] = "";
    char *path = mtrun_resolve_program(o->program_argv[0], &code, why, sizeof why);
    if (!path) {
        snprintf(text, sizeof text, "cannot execute '%s' on node %d: %s", o->program_argv[0],
                 o->node_rank, why);
        fail(j, code, text, true, false, SIGTERM);
        return;
    }
    mtrun_launch l = {.path = path, .argv = o->program_argv, .nnodes = o->nnodes,
                      .nproc_per_node = o->nproc_per_node, .node_rank = o->node_rank,
                      /* The hosting node's ranks reach its store where it listens (on
                       * every interface: by the name the other nodes use too). */
                      .master_addr = o->hosts_store && o->store_listen[0] ? o->store_bind
                                                                          : o->master_addr,
                      .master_port = j->port,
                      .job_id = o->rdzv_id, .role = o->role, .restart_count = j->round,
                      .max_restarts = o->max_restarts};
    mtrun_fr_prepare(o->fr, o->node_rank);
    for (int i = 0; i < j->n && j->ph == RUNNING; i++) {
        rank_slot *r = &j->ranks[i];
        int out_fd, err_fd;
        l.flight_recorder = mtrun_fr_file(o->fr, i);
        char why_bind[512];
        if (mtrun_binding_enter(j->binding, i, why_bind, sizeof why_bind) != 0) {
            mtrun_binding_leave(j->binding);
            snprintf(text, sizeof text, "cannot start rank %d (node %d): %s", r->global,
                     o->node_rank, why_bind);
            fail(j, 1, text, true, false, SIGTERM);
            break;
        }
        l.cpu_sharers = mtrun_binding_sharers(j->binding, i);
        pid_t pid = mtrun_spawn_rank(&l, i, &out_fd, &err_fd);
        int spawn_errno = errno;
        mtrun_binding_leave(j->binding);
        errno = spawn_errno;
        if (pid < 0) {
            int e = errno;
            snprintf(text, sizeof text, "cannot start rank %d (node %d, local rank %d): cannot "
                     "execute '%s': %s", r->global, o->node_rank, i, o->program_argv[0],
                     strerror(e));
            fail(j, e == ENOENT ? 127 : e == EACCES || e == ENOEXEC ? 126 : 1, text, true,
                 false, SIGTERM);
            break;
        }
        r->pid = pid;
        r->alive = true;
        /* Before any of the rank's own output, which is only read once all ranks are started.
         * A binding says something of each rank; its absence is the same for all of them. */
        const char *binding = mtrun_binding_line(j->binding);
        bool alike = i > 0 && strncmp(binding, "not bound", 9) == 0 &&
                     strcmp(binding, first_line) == 0;
        if (i == 0) snprintf(first_line, sizeof first_line, "%s", binding);
        char line[2300];
        int len = snprintf(line, sizeof line, "[rank%d]: %s\n", r->global, binding);
        if (len > 0 && !alike)
            mtrun_write_all(STDERR_FILENO, line, strnlen(line, sizeof line - 1));
        char log_out[4096], log_err[4096];
        bool logged = o->logs != NULL;
        /* attempt_K: each restart's files beside the earlier rounds', as torchrun keeps them */
        if (logged &&
            mtrun_logs_rank_paths(o->logs, j->round, i, log_out, log_err, sizeof log_out)) {
            snprintf(text, sizeof text, "cannot create the log directory of local rank %d in "
                     "%s: %s", i, o->logs->job_dir, strerror(errno));
            fail(j, 1, text, true, false, SIGTERM);
            logged = false;
        }
        /* -1: a redirected stream goes to its file only */
        int out_to = mtrun_logs_on_console(o->logs, i, MTRUN_STD_OUT) ? STDOUT_FILENO : -1;
        int err_to = mtrun_logs_on_console(o->logs, i, MTRUN_STD_ERR) ? STDERR_FILENO : -1;
        int bad_out = mtrun_stream_open(&r->out, out_fd, out_to, r->global,
                                        logged ? log_out : NULL);
        int out_errno = errno;
        int bad_err = mtrun_stream_open(&r->err, err_fd, err_to, r->global,
                                        logged ? log_err : NULL);
        if (bad_out || bad_err) {
            int e = bad_out ? out_errno : errno;
            const char *bad = bad_out ? log_out : log_err;
            if (e == ELOOP)
                snprintf(text, sizeof text, "cannot open the log file %s of rank %d: it is a "
                         "symbolic link, and mtrun never writes a log file through one", bad,
                         r->global);
            else
                snprintf(text, sizeof text, "cannot open the log file %s of rank %d: %s", bad,
                         r->global, strerror(e));
            fail(j, 1, text, true, false, SIGTERM);
        }
    }
    free(path);
}

/* Milliseconds poll() may sleep: forever unless a deadline or the store check is pending. */
static int poll_timeout_ms(const job *j) {
    double wait = -1;
    if (j->ph == STOPPING) {
        /* a short tick; once the deadline has passed (waiting for SIGKILLed processes to go),
         * still a tick rather than a zero timeout that would spin */
        double until = j->deadline - mtrun_now();
        wait = until > 0 && until < STOP_TICK_S ? until : STOP_TICK_S;
    } else if (j->ph == DRAINING && j->deadline >= 0) {
        wait = j->deadline - mtrun_now();
        if (wait < 0) wait = 0;
    }
    if (j->cluster && (wait < 0 || wait > 1.0)) wait = 1.0;
    if (wait < 0) return -1;
    return (int)(wait * 1000) + 1;
}

static void loop(job *j, int sigfd) {
    struct pollfd *fds = calloc((size_t)(2 * j->n + 2), sizeof *fds);
    mtrun_stream **streams = calloc((size_t)(2 * j->n + 2), sizeof *streams);
    if (!fds || !streams) {
        /* Cannot supervise: stop what runs rather than leave it unwatched. */
        fail(j, 1, "out of memory in the supervision loop", true, false, SIGKILL);
        free(fds);
        free(streams);
        for (int i = 0; i < j->n; i++)
            if (j->ranks[i].pid > 0) kill(-j->ranks[i].pid, SIGKILL);
        return;
    }
    while (j->ph != FINISHED) {
        int nf = 0;
        fds[nf++] = (struct pollfd){.fd = sigfd, .events = POLLIN};
        if (j->cluster)
            fds[nf++] = (struct pollfd){.fd = mtrun_cluster_fd(j->cluster), .events = POLLIN};
        int first_stream = nf;
        for (int i = 0; i < j->n; i++) {
            mtrun_stream *pair[2] = {&j->ranks[i].out, &j->ranks[i].err};
            for (int k = 0; k < 2; k++) {
                if (pair[k]->fd < 0) continue;
                streams[nf] = pair[k];
                fds[nf++] = (struct pollfd){.fd = pair[k]->fd, .events = POLLIN};
            }
        }
        int ready = poll(fds, (nfds_t)nf, poll_timeout_ms(j));
        if (ready < 0 && errno != EINTR) {
            mtrun_msg("poll failed: %s", strerror(errno));
            fail(j, 1, "mtrun's supervision loop failed", true, false, SIGKILL);
            break;
        }
        for (int k = first_stream; ready > 0 && k < nf; k++)
            if (fds[k].revents) mtrun_stream_pump(streams[k]);
        if (ready > 0 && (fds[0].revents & POLLIN)) {
            struct signalfd_siginfo si;
            while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
                if (si.ssi_signo == SIGCHLD) reap(j);
                else on_signal(j, (int)si.ssi_signo);
            }
        }
        /* A SIGCHLD may have been merged with one already read: reaping again is cheap. */
        reap(j);
        if (j->cluster) on_cluster(j);
        on_timer(j);
        if (j->ph == RUNNING && all_reaped(j)) {
            ranks_done(j);
        } else if (j->ph == STOPPING && groups_empty(j)) {
            ranks_done(j);
        }
    }
    free(fds);
    free(streams);
}

int mtrun_job_run(const mtrun_options *o, int round, int store_port, mtrun_cluster *cluster,
                  mtrun_binding *binding, int sigfd, double timeout_s, double kill_grace_s,
                  char *restart_after, size_t cap) {
    job j = {.o = o, .cluster = cluster, .binding = binding, .n = o->nproc_per_node,
             .ph = RUNNING, .code = 0, .port = store_port, .grace = kill_grace_s,
             .timeout = timeout_s, .round = round};
    restart_after[0] = '\0';
    j.ranks = calloc((size_t)j.n, sizeof *j.ranks);
    if (!j.ranks) {
        mtrun_msg("out of memory for %d ranks", j.n);
        return 1;
    }
    for (int i = 0; i < j.n; i++) {
        rank_slot *r = &j.ranks[i];
        r->local = i;
        r->global = o->node_rank * o->nproc_per_node + i;
        r->out.fd = r->err.fd = r->out.log_fd = r->err.log_fd = -1;
    }
    start_ranks(&j);
    loop(&j, sigfd);
    for (int i = 0; i < j.n; i++) {
        mtrun_stream_close(&j.ranks[i].out);
        mtrun_stream_close(&j.ranks[i].err);
    }
    free(j.ranks);
    decline_next_round(&j);
    if (will_restart(&j)) snprintf(restart_after, cap, "%s", j.failure);
    else if (j.failed && j.restartable && !j.signaled && o->max_restarts > 0)
        mtrun_msg("giving up after %d restart%s (--max_restarts %d); the last failure: %s",
                  round, round == 1 ? "" : "s", o->max_restarts, j.failure);
    return j.code;
}
