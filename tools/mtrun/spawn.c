/* The child between fork and exec may only call async-signal-safe functions (mtrun already runs
 * the store's threads), so everything it needs, the environment included, is built before fork. */
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

/* Returns 0 when path names a regular file we may execute, else an errno value. */
static int check_executable(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return errno;
    if (S_ISDIR(st.st_mode)) return EISDIR;
    if (access(path, X_OK) != 0) return errno;
    return 0;
}

char *mtrun_resolve_program(const char *name, int *err_code, char *why, size_t why_cap) {
    if (strchr(name, '/')) {
        int e = check_executable(name);
        if (e == 0) return strdup(name);
        *err_code = e == ENOENT || e == ENOTDIR ? 127 : 126;
        snprintf(why, why_cap, "%s", strerror(e));
        return NULL;
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    int first_error = 0;
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t dlen = colon ? (size_t)(colon - path) : strlen(path);
        char cand[PATH_MAX];
        int n = dlen ? snprintf(cand, sizeof cand, "%.*s/%s", (int)dlen, path, name)
                     : snprintf(cand, sizeof cand, "./%s", name);
        if (n > 0 && (size_t)n < sizeof cand) {
            int e = check_executable(cand);
            if (e == 0) return strdup(cand);
            if (e != ENOENT && e != ENOTDIR && !first_error) first_error = e;
        }
        path += dlen + (colon ? 1 : 0);
        if (!colon) break;
    }
    if (first_error) {
        *err_code = 126;
        snprintf(why, why_cap, "found in PATH but %s", strerror(first_error));
    } else {
        *err_code = 127;
        snprintf(why, why_cap, "not found in PATH");
    }
    return NULL;
}

static int env_is(const char *entry, const char *name) {
    size_t n = strlen(name);
    return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

static char *env_entry(const char *name, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static char *env_entry(const char *name, const char *fmt, ...) {
    char value[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    size_t len = strlen(name) + 1 + strlen(value) + 1;
    char *e = malloc(len);
    if (e) snprintf(e, len, "%s=%s", name, value);
    return e;
}

/* The variables mtrun owns replace inherited ones; OMP threads default to 1 when several ranks
 * share the node, OpenBLAS threads to 1 always, unless the user chose otherwise. A meshtrain
 * rank runs OpenBLAS on 1 thread anyway (its pool's threads call it, core/thread_pool.c), but
 * only the variable, read when OpenBLAS is loaded, keeps OpenBLAS from starting its own workers,
 * which spin on sched_yield for about 0.1 s before they sleep (docs/cpu-kernels.md). */
static char **build_env(const mtrun_launch *l, int local_rank, char ***owned, int *nowned) {
    static const char *const set_names[] = {
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT", "MT_RDZV_ID", "TORCHELASTIC_RUN_ID", "MT_NNODES", "MT_STORE_HOSTED",
        "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "MT_STORE_PREFIX",
        /* never inherited: another mtrun's ring, or one the recorder being off must not use */
        "MT_FLIGHT_RECORDER_FILE"};
    enum { NSET = sizeof set_names / sizeof set_names[0] };
    char *mine[NSET + 4];
    int n = 0;
    long rank = (long)l->node_rank * l->nproc_per_node + local_rank;
    mine[n++] = env_entry("RANK", "%ld", rank);
    mine[n++] = env_entry("LOCAL_RANK", "%d", local_rank);
    mine[n++] = env_entry("WORLD_SIZE", "%ld", (long)l->nnodes * l->nproc_per_node);
    mine[n++] = env_entry("LOCAL_WORLD_SIZE", "%d", l->nproc_per_node);
    mine[n++] = env_entry("GROUP_RANK", "%d", l->node_rank);
    mine[n++] = env_entry("MASTER_ADDR", "%s", l->master_addr);
    mine[n++] = env_entry("MASTER_PORT", "%d", l->master_port);
    mine[n++] = env_entry("MT_RDZV_ID", "%s", l->job_id);
    mine[n++] = env_entry("TORCHELASTIC_RUN_ID", "%s", l->job_id);
    mine[n++] = env_entry("MT_NNODES", "%d", l->nnodes);
    mine[n++] = env_entry("MT_STORE_HOSTED", "1");
    /* torchelastic's variables: one role holds every rank. */
    mine[n++] = env_entry("GROUP_WORLD_SIZE", "%d", l->nnodes);
    mine[n++] = env_entry("ROLE_RANK", "%ld", rank);
    mine[n++] = env_entry("ROLE_WORLD_SIZE", "%ld", (long)l->nnodes * l->nproc_per_node);
    mine[n++] = env_entry("ROLE_NAME", "%s", l->role);
    mine[n++] = env_entry("TORCHELASTIC_RESTART_COUNT", "%d", l->restart_count);
    mine[n++] = env_entry("TORCHELASTIC_MAX_RESTARTS", "%d", l->max_restarts);
    /* Each round's ranks keep to their own keys in the store that outlives the round. */
    mine[n++] = env_entry("MT_STORE_PREFIX", "round/%d/", l->restart_count);
    if (l->cpu_sharers > 0) mine[n++] = env_entry("MT_CPU_SHARERS", "%d", l->cpu_sharers);
    if (l->flight_recorder)
        mine[n++] = env_entry("MT_FLIGHT_RECORDER_FILE", "%s", l->flight_recorder);
    if (l->nproc_per_node > 1 && !getenv("OMP_NUM_THREADS"))
        mine[n++] = env_entry("OMP_NUM_THREADS", "1");
    if (!getenv("OPENBLAS_NUM_THREADS")) mine[n++] = env_entry("OPENBLAS_NUM_THREADS", "1");
    size_t count = 0;
    while (environ[count]) count++;
    char **env = malloc((count + (size_t)n + 1) * sizeof *env);
    char **keep = malloc((size_t)n * sizeof *keep);
    int ok = env && keep;
    for (int i = 0; i < n; i++) ok = ok && mine[i];
    if (!ok) {
        for (int i = 0; i < n; i++) free(mine[i]);
        free(env);
        free(keep);
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        int replaced = 0;
        for (int j = 0; j < NSET && !replaced; j++) replaced = env_is(environ[i], set_names[j]);
        /* A binding mtrun applied itself knows better than an inherited count. */
        if (l->cpu_sharers > 0 && env_is(environ[i], "MT_CPU_SHARERS")) replaced = 1;
        if (!replaced) env[k++] = environ[i];
    }
    for (int i = 0; i < n; i++) env[k++] = keep[i] = mine[i];
    env[k] = NULL;
    *owned = keep;
    *nowned = n;
    return env;
}

/* Runs in the child: nothing here may allocate or take locks. */
static void child_exec(const mtrun_launch *l, char **env, int out_w, int err_w, int report_w,
                       pid_t parent) {
    setpgid(0, 0);
    /* If mtrun itself is killed (SIGKILL cannot be forwarded), the rank must not live on. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127); /* mtrun died before prctl took effect */
    /* mtrun's handlers (main.c's forward_signals) would send a signal that comes before exec
     * back to this very thread, again and again: the defaults first, then unblock */
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    static const int handled[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1};
    for (size_t i = 0; i < sizeof handled / sizeof *handled; i++) sigaction(handled[i], &dfl, NULL);
    sigaction(SIGPIPE, &dfl, NULL); /* mtrun ignores SIGPIPE; exec would keep that */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (dup2(out_w, STDOUT_FILENO) < 0 || dup2(err_w, STDERR_FILENO) < 0) {
        int e = errno;
        (void)!write(report_w, &e, sizeof e);
        _exit(127);
    }
    /* Close every other descriptor mtrun holds (store sockets above all: a rank that kept node
     * 0's store connection open would hide node 0's death from the other nodes). The report pipe
     * is close-on-exec and stays open until exec succeeds. */
    if (report_w > 3) syscall(SYS_close_range, 3u, (unsigned)report_w - 1, 0u);
    syscall(SYS_close_range, (unsigned)report_w + 1, ~0u, 0u);
    execve(l->path, l->argv, env);
    int e = errno;
    (void)!write(report_w, &e, sizeof e);
    _exit(e == ENOENT ? 127 : 126);
}

pid_t mtrun_spawn_rank(const mtrun_launch *l, int local_rank, int *out_fd, int *err_fd) {
    char **owned = NULL;
    int nowned = 0;
    char **env = build_env(l, local_rank, &owned, &nowned);
    if (!env) {
        errno = ENOMEM;
        return -1;
    }
    int out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, rep_p[2] = {-1, -1};
    pid_t pid = -1;
    int saved = 0;
    if (pipe2(out_p, O_CLOEXEC) || pipe2(err_p, O_CLOEXEC) || pipe2(rep_p, O_CLOEXEC)) {
        saved = errno;
        goto done;
    }
    pid_t parent = getpid();
    pid = fork();
    if (pid < 0) {
        saved = errno;
        goto done;
    }
    if (pid == 0) child_exec(l, env, out_p[1], err_p[1], rep_p[1], parent);
    setpgid(pid, pid); /* also here, so that the group exists before we ever signal it */
    close(rep_p[1]);
    rep_p[1] = -1;
    int child_errno = 0;
    ssize_t got;
    do {
        got = read(rep_p[0], &child_errno, sizeof child_errno);
    } while (got < 0 && errno == EINTR);
    if (got == (ssize_t)sizeof child_errno) {
        /* exec failed: the child exits on its own; the caller reaps it with the others */
        saved = child_errno;
        pid = -1;
        goto done;
    }
    *out_fd = out_p[0];
    *err_fd = err_p[0];
    out_p[0] = err_p[0] = -1;
done:
    for (int i = 0; i < 2; i++) {
        if (out_p[i] >= 0) close(out_p[i]);
        if (err_p[i] >= 0) close(err_p[i]);
        if (rep_p[i] >= 0) close(rep_p[i]);
    }
    for (int i = 0; i < nowned; i++) free(owned[i]);
    free(owned);
    free(env);
    if (saved) errno = saved;
    return pid;
}
