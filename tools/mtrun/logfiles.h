/* Per-rank log files and torchrun's --redirects/--tee: which streams of which local ranks reach
 * the console, and where each rank's files are (DIR/<job id>_<unique>/attempt_N/<local rank>/
 * stdout.log and stderr.log, torchrun's layout). */
#ifndef MTRUN_LOGFILES_H
#define MTRUN_LOGFILES_H

#include <stddef.h>

struct mtrun_options;

/* Stream bits of a --redirects/--tee value, as torchrun numbers them. */
enum { MTRUN_STD_OUT = 1, MTRUN_STD_ERR = 2 };

typedef struct mtrun_logs {
    char job_dir[4096];      /* DIR/<job id>_<unique>; attempt directories go below */
    int nproc;               /* local ranks */
    unsigned char *redirect; /* per local rank: MTRUN_STD_* bits kept off the console */
    unsigned char *tee;      /* per local rank: bits copied to files and the console */
} mtrun_logs;

/* Checks a --redirects or --tee value (N, or LOCAL_RANK:N,... with N in 0..3 and local ranks
 * below nproc) and, when out is not NULL, stores each local rank's bits in out[0..nproc).
 * Returns 0, or 2 after printing one line saying what is wrong. */
int mtrun_std_spec_parse(const char *option, const char *value, int nproc, unsigned char *out);

/* Decides the log files of this node from --log_dir, --redirects and --tee: none when all three
 * are absent; a new temporary directory when only --redirects/--tee are given (as torchrun does).
 * Creates DIR/<job id>_<unique> and says on stderr where the files go. *logs is NULL when there
 * are no files. Returns 0, or an exit code after printing why. */
int mtrun_logs_prepare(const struct mtrun_options *o, mtrun_logs **logs);

/* Creates DIR/.../attempt_<attempt>/<local_rank> and writes the paths of its stdout.log and
 * stderr.log. Returns 0, or -1 with errno. */
int mtrun_logs_rank_paths(const mtrun_logs *logs, int attempt, int local_rank, char *out_path,
                          char *err_path, size_t cap);

/* Opens (creates, truncates) one log file for writing: mode 0600, as a rank's output may hold
 * what others must not read, and never through a symbolic link planted at its path (O_NOFOLLOW:
 * fails with ELOOP). Returns the descriptor, or -1 with errno. */
int mtrun_logs_open_file(const char *path);

/* Whether the stream (MTRUN_STD_OUT or MTRUN_STD_ERR) of local_rank is shown on the console. */
int mtrun_logs_on_console(const mtrun_logs *logs, int local_rank, int stream);

void mtrun_logs_free(mtrun_logs *logs);

#endif
