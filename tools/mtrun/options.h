/* mtrun's command line: torchrun's option names, dash or underscore spelling. */
#ifndef MTRUN_OPTIONS_H
#define MTRUN_OPTIONS_H

#include "topo/bind.h"

#include <stdbool.h>

typedef enum { MTRUN_RDZV_STATIC, MTRUN_RDZV_C10D } mtrun_rdzv_backend;

typedef struct mtrun_options {
    int nnodes;
    int nproc_per_node;
    int node_rank;        /* c10d without --node_rank: -1 until the store assigns it */
    bool node_rank_given;
    const char *master_addr;
    int master_port;      /* 0 with --standalone: the store picks a free port */
    const char *rdzv_id;  /* the job id */
    mtrun_rdzv_backend rdzv_backend;
    const char *local_addr;     /* --local_addr, NULL when not given */
    double join_timeout;        /* --rdzv_conf join_timeout; < 0: MT_TIMEOUT_S */
    double last_call_timeout;   /* accepted; no effect while membership is fixed */
    int is_host;                /* --rdzv_conf is_host: 1, 0, or -1 to decide by address */
    char token_file[256];       /* --rdzv_conf token_file: "" when not given */
    const char *role;           /* --role: ROLE_NAME */
    int max_restarts;           /* --max_restarts: rounds after the first one (restart.c) */
    double monitor_interval;    /* accepted; mtrun is woken by SIGCHLD rather than polling */
    bool hosts_store;           /* decided in main: this mtrun hosts the rendezvous store */
    char store_listen[64];      /* where the hosted store listens ("": every interface) */
    char store_bind[64];        /* where this node's mtrun and ranks reach the hosted store */
    char endpoint_host[256];    /* --rdzv_endpoint's host (master_addr points here) */
    const char *log_dir;  /* NULL: no log files unless --redirects/--tee (a temporary dir) */
    const char *redirects, *tee; /* --redirects/--tee as given (checked); NULL when absent */
    struct mtrun_logs *logs;     /* set in main by mtrun_logs_prepare; NULL: no log files */
    bool standalone;
    /* --bind, else MT_BIND; bind_from says which ("--bind" or "MT_BIND"), NULL when neither
     * was given: then the default, numa when the topology has GPUs and none otherwise. */
    mt_bind_mode bind;
    const char *bind_from;
    char **program_argv;  /* PROGRAM ARGS..., NULL-terminated (points into argv) */
} mtrun_options;

/* Outcome of parsing: run the job, or exit right away with this code. */
enum { MTRUN_PARSE_RUN = -1 };

/* Parses argv. Returns MTRUN_PARSE_RUN to go on, or an exit code: 0 after printing the help
 * on stdout, 2 after printing one line saying what is wrong on stderr. */
int mtrun_parse_options(int argc, char **argv, mtrun_options *opts);

#endif
