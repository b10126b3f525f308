/* mtrun's command line: torchrun's option names, dash or underscore spelling. */
#ifndef MTRUN_OPTIONS_H
#define MTRUN_OPTIONS_H

#include "topo/bind.h"

#include <stdbool.h>

typedef struct mtrun_options {
    int nnodes;
    int nproc_per_node;
    int node_rank;
    const char *master_addr;
    int master_port;      /* 0 with --standalone: the store picks a free port */
    const char *rdzv_id;  /* the job id */
    const char *log_dir;  /* NULL: no log files */
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
