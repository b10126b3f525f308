/* Internal: the launch environment of a process, parsed once by mt_init.
 *
 * Sources, first match wins: torchrun-style variables (RANK and WORLD_SIZE, set by mtrun, torchrun
 * or by hand), then Slurm (SLURM_PROCID and SLURM_NTASKS), else a single-process world whose
 * store is hosted in-process on a free port. Parsing is separate from the process environment
 * (a lookup callback) so that tests can feed any environment.
 */
#ifndef MT_MESH_RUNTIME_ENV_H
#define MT_MESH_RUNTIME_ENV_H

#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

#define MT_ENV_HOST_MAX 256
#define MT_ENV_JOB_MAX 256
#define MT_ENV_PREFIX_MAX 65 /* MT_STORE_MAX_PREFIX + 1 */

typedef enum mt_env_source {
    MT_ENV_SINGLE = 0, /* nothing set: rank 0 of 1 */
    MT_ENV_TORCHRUN,   /* RANK/WORLD_SIZE (mtrun, torchrun, or by hand) */
    MT_ENV_SLURM       /* SLURM_PROCID/SLURM_NTASKS */
} mt_env_source;

typedef struct mt_runtime_env {
    mt_env_source source;
    int rank, world_size;
    int local_rank, local_world_size; /* -1 when not given */
    int node_rank, num_nodes;         /* -1 when not given */
    char master_addr[MT_ENV_HOST_MAX];
    int master_port; /* 0: pick a free port (single-process world) */
    char job_id[MT_ENV_JOB_MAX];
    bool store_hosted; /* MT_STORE_HOSTED=1: the launcher hosts the store, rank 0 must not */
    char store_prefix[MT_ENV_PREFIX_MAX]; /* MT_STORE_PREFIX: before every store key (a round) */
} mt_runtime_env;

/* Returns the value of an environment variable or NULL. */
typedef const char *(*mt_env_lookup)(const char *name, void *ctx);

/* Parses the launch environment. Invalid values are MT_ERR_INVALID_ARG errors that name the
 * variable and its value. */
mt_status mt_runtime_env_parse(mt_env_lookup lookup, void *ctx, mt_runtime_env *out);

/* mt_runtime_env_parse over the process environment (getenv). */
mt_status mt_runtime_env_from_process(mt_runtime_env *out);

/* The first host of a Slurm node list, e.g. "gpu[003-005,007],cpu1" -> "gpu003". */
mt_status mt_slurm_first_host(const char *nodelist, char *out, size_t cap);

/* Human name of the source ("mtrun/torchrun variables", "Slurm", "single process"). */
const char *mt_env_source_name(mt_env_source source);

#endif
