/* Starting one rank: its own process group, its environment, its output pipes. */
#ifndef MTRUN_SPAWN_H
#define MTRUN_SPAWN_H

#include <sys/types.h>

/* What every rank of this node shares. */
typedef struct mtrun_launch {
    const char *path;     /* resolved executable */
    char **argv;          /* PROGRAM ARGS..., NULL-terminated */
    int nnodes, nproc_per_node, node_rank;
    const char *master_addr;
    int master_port;      /* the port the store really listens on */
    const char *job_id;
    const char *role;     /* ROLE_NAME */
    int restart_count, max_restarts; /* TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS */
    /* MT_CPU_SHARERS of the rank spawned next: how many local ranks mtrun bound to its cpus, so
     * that its thread pool takes its share (core/thread_pool.h); 0 when mtrun did not bind it. */
    int cpu_sharers;
    /* MT_FLIGHT_RECORDER_FILE of the rank spawned next (comm/flight_rec.h), NULL: none. */
    const char *flight_recorder;
} mtrun_launch;

/* Finds the executable the way execvp would (PATH search when name has no '/'). On success
 * returns a malloc'd path; otherwise NULL with *err_code set to the exit code the job ends with
 * (127: not found, 126: not executable) and why written into why. */
char *mtrun_resolve_program(const char *name, int *err_code, char *why, size_t why_cap);

/* Forks local rank `local_rank` in a new process group with its stdout/stderr on new pipes.
 * Returns the child's pid and the pipes' read ends, or -1 with errno set; when the exec itself
 * fails in the child, -1 is returned with errno set to the exec error. */
pid_t mtrun_spawn_rank(const mtrun_launch *l, int local_rank, int *out_fd, int *err_fd);

#endif
