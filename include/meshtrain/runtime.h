/* The runtime: one per process. mt_init reads the launcher's environment (mtrun/torchrun, Slurm,
 * or variables set by hand), joins the rendezvous store, checks that every process belongs to the
 * same job and world size, derives local ranks from host identities, opens the rank's device and
 * connects the UCX transport so that the world group is ready.
 *
 * Environment (torchrun's names): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK
 * (node rank), MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default 29500), MT_RDZV_ID or
 * TORCHELASTIC_RUN_ID (job id). Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
 * SLURM_JOB_ID. Without mtrun, rank 0 hosts the store at MASTER_ADDR:MASTER_PORT.
 * MT_TIMEOUT_S bounds every wait; MT_SOCKET_IFNAME picks the network interface.
 */
#ifndef MESHTRAIN_RUNTIME_H
#define MESHTRAIN_RUNTIME_H

#include <meshtrain/api.h>
#include <meshtrain/device.h>
#include <meshtrain/status.h>
#include <meshtrain/store.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_runtime mt_runtime;
typedef struct mt_group mt_group;

/* Initializes the runtime. argc/argv may be NULL; they are not modified today (reserved for
 * runtime options). */
MT_API mt_status mt_init(mt_runtime **out, int *argc, char ***argv);

/* Tears the runtime down: waits (a barrier bounded by MT_TIMEOUT_S) until every rank is done
 * communicating, then closes transport, store and device. After an error that nothing recovered
 * from (a failed collective, a failed forward/backward of a root module, mt_error_set) it does
 * not wait: it publishes the error as the job's abort and closes at once. The other ranks then
 * end within about a second: their waits for collectives (and their own mt_finalize) stop with
 * this rank's status and "... the job was aborted: <this rank's message>"; under mtrun, this
 * rank's non-zero exit stops the job anyway. */
MT_API void mt_finalize(mt_runtime *rt);

/* Ends the job now, like MPI_Abort: logs mt_last_error() (or the status's name), publishes it as
 * the job's abort so that every rank's waits stop with it, and exits the process with status as
 * its code (mtrun then stops the other ranks). rt may be NULL (before mt_init succeeded).
 * Does not return. */
MT_API void mt_abort(mt_runtime *rt, mt_status status)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((noreturn))
#endif
    ;

MT_API int mt_runtime_rank(const mt_runtime *rt);
MT_API int mt_runtime_world_size(const mt_runtime *rt);
MT_API int mt_runtime_local_rank(const mt_runtime *rt);
MT_API int mt_runtime_local_world_size(const mt_runtime *rt);
/* The node (mtrun instance) this process belongs to, and how many nodes the job has. */
MT_API int mt_runtime_node_rank(const mt_runtime *rt);
MT_API int mt_runtime_num_nodes(const mt_runtime *rt);
/* Host identity "hostname/node_rank": several mtrun on one machine are separate hosts. */
MT_API const char *mt_runtime_host(const mt_runtime *rt);
/* Host identity of any rank of the job. */
MT_API const char *mt_runtime_host_of(const mt_runtime *rt, int rank);
MT_API const char *mt_runtime_job_id(const mt_runtime *rt);

/* The rendezvous store client of this process. */
MT_API mt_store *mt_runtime_store(mt_runtime *rt);

/* The rank's device (CPU, or CUDA when available). */
MT_API mt_device *mt_runtime_device(mt_runtime *rt);

/* The group of all ranks. */
MT_API mt_group *mt_runtime_world(mt_runtime *rt);

/* One line describing this host's topology (MT_TOPO_FILE when set, else discovered once):
 * source, packages, NUMA nodes, cores, GPUs with their NVLink islands, NICs. Returns
 * MT_OK with buf filled, or the error of loading the topology. */
MT_API mt_status mt_runtime_topology_summary(mt_runtime *rt, char *buf, size_t size);

/* MT_TIMEOUT_S in seconds (300 when unset). */
MT_API double mt_runtime_timeout(const mt_runtime *rt);

#ifdef __cplusplus
}
#endif
#endif
