/* mt_init and mt_finalize: from the launcher's environment to a ready world group.
 *
 * The order matters: the store comes first (everything else meets there), then the join checks
 * (same world size, no duplicate rank; the job id was checked by the store handshake), then one
 * barrier so that every host identity is published before local ranks are derived from them, and
 * only then the device and the UCX transport, which need the local rank and the peers' identities.
 * A process that fails a join check publishes why under MT_JOB_ABORT_KEY, so the others stop at
 * once with its message instead of waiting MT_TIMEOUT_S for a rank that will never arrive.
 */
#include "mesh/abort_key.h"
#include "mesh/netif.h"
#include "mesh/runtime_env.h"
#include "mesh/runtime_device.h"
#include "mesh/runtime_topo.h"
#include "store/auth.h"
#include "store/store_internal.h"
#include "comm/abort_probe.h"
#include "comm/transport.h"

#include "core/clock.h"
#include "core/error.h"
#include "core/fd_limit.h"
#include "core/log_internal.h"
#include "core/thread_pool.h"
#include "topo/classify.h"
#include "topo/topo_open.h"

#include <meshtrain/log.h>
#include <meshtrain/runtime.h>
#include <meshtrain/version.h>

#include <openssl/crypto.h>

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

_Static_assert(MT_ENV_PREFIX_MAX == MT_STORE_MAX_PREFIX + 1,
               "MT_ENV_PREFIX_MAX must hold a store key prefix of MT_STORE_MAX_PREFIX bytes");

#define IDENTITY_MAX (MT_ENV_HOST_MAX + 16)
/* How long a failing store host waits for the others to read the abort before it exits. */
#define ABORT_LINGER_S 2.0

struct mt_runtime {
    mt_runtime_env env;
    int rank, world, local_rank, local_world, node_rank, num_nodes;
    double timeout;
    char host[IDENTITY_MAX];
    char **hosts; /* identity of every rank */
    char store_addr[MT_ENV_HOST_MAX + 8];
    mt_store_server *server; /* only when this process hosts the store */
    mt_store *store;
    mt_device *device;
    mt_transport *transport;
    mt_group *world_group;
    mt_topo *topo; /* NULL until mt_runtime_topology loads it */
};

/* Publishes the failure as the job's abort (the first one published wins: it is the cause),
 * keeping this process's own error. message may be mt_last_error(): it is copied first. */
static void publish_abort(mt_runtime *rt, mt_status status, const char *message) {
    if (!rt->store) return;
    char saved[2048];
    snprintf(saved, sizeof saved, "%s", mt_last_error());
    message = message == mt_last_error() ? saved : message;
    if (mt_store_abort(rt->store, MT_JOB_ABORT_KEY, status, message) != MT_OK)
        mt_log(MT_LOG_DEBUG, "could not publish the abort: %s", mt_last_error());
    mt_error_restore(MT_OK, saved);
}

/* Tells the other processes why this one gives up, keeping this process's own error. */
static mt_status publish_failure(mt_runtime *rt, mt_status st) {
    publish_abort(rt, st, mt_last_error());
    return st;
}

/* The comm waits' probe (comm/abort_probe.h): has a rank published an abort? A store that no
 * longer answers counts too: its host has gone, and the job with it. The caller's last error
 * is kept. */
static bool job_aborted(void *arg, mt_status *status, char *why, size_t cap) {
    mt_runtime *rt = arg;
    char saved[2048];
    snprintf(saved, sizeof saved, "%s", mt_last_error());
    void *v = NULL;
    bool found = false;
    mt_status st = mt_store_try_get(rt->store, MT_JOB_ABORT_KEY, &v, NULL, &found);
    /* A store whose connection is gone took its host with it; any other error (a slow reply)
     * says nothing about the job. */
    bool lost = st == MT_ERR_IO || st == MT_ERR_PEER_LOST;
    if (lost) {
        *status = MT_ERR_PEER_LOST;
        snprintf(why, cap, "the rendezvous store at %s stopped answering (%s): the process "
                 "hosting it has probably failed", rt->store_addr, mt_last_error());
    } else if (st == MT_OK && found) {
        snprintf(why, cap, "%s", mt_store_abort_parse(v, status));
    }
    free(v);
    mt_error_restore(MT_OK, saved);
    return lost || (st == MT_OK && found);
}

/* A store host that fails lets the others read why before the store disappears with it. */
static void linger_for_clients(mt_store_server *server, double limit_s) {
    double end = mt_clock_now_s() + limit_s;
    while (mt_store_server_clients(server) > 0 && mt_clock_now_s() < end) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
}

/* ---- joining ------------------------------------------------------------------------------- */

/* A job whose ranks all run on this host: its store and UCX listen on loopback only. */
static bool single_host(const mt_runtime_env *env) {
    return env->source == MT_ENV_SINGLE || env->num_nodes == 1 || env->world_size == 1;
}

/* Rank 0 hosts the store (no launcher did): on loopback for a single host, else on the address
 * that reaches MASTER_ADDR; *host is where this rank connects, *token what it proves. */
static mt_status host_store(mt_runtime *rt, char *host, size_t cap, const char **token,
                            char fresh[MT_STORE_TOKEN_HEX_LEN]) {
    const mt_runtime_env *env = &rt->env;
    bool single = single_host(env);
    char listen_at[64];
    MT_TRY(mt_netif_store_bind(env->master_addr, single, listen_at, host,
                               cap < sizeof listen_at ? cap : sizeof listen_at));
    const char *given = getenv("MT_STORE_TOKEN");
    *token = NULL; /* MT_STORE_TOKEN */
    if ((!given || !*given) && rt->world == 1) {
        /* A single process is its store's only client: a secret nobody else ever sees. */
        MT_TRY(mt_store_token_generate(fresh));
        *token = fresh;
    } else if ((!given || !*given) && !single) {
        mt_log(MT_LOG_WARN, "rank 0 hosts the rendezvous store on %s:%d without MT_STORE_TOKEN: "
               "anyone who reaches that port can join, read or stop the job (docs/security.md)",
               host, env->master_port);
    }
    int max_clients = mt_store_default_max_clients(rt->world, 1);
    char what[96];
    snprintf(what, sizeof what, "rank 0's rendezvous store for %d ranks", rt->world);
    MT_TRY(mt_fd_limit_raise((uint64_t)max_clients + 64, what, NULL));
    mt_store_server_opts o = {.bind_addr = listen_at, .port = env->master_port,
                              .job_id = env->job_id,
                              .token = *token, .max_clients = max_clients};
    int listen_err;
    mt_status st = mt_store_server_start_opts(&o, &rt->server, &listen_err);
    if (st != MT_OK)
        return mt_error_wrap(st, "rank 0 hosts the rendezvous store (no MT_STORE_HOSTED=1 from "
                             "a launcher)");
    return MT_OK;
}

static mt_status open_store(mt_runtime *rt) {
    const mt_runtime_env *env = &rt->env;
    int port = env->master_port;
    char host[64];
    snprintf(host, sizeof host, "%s", env->master_addr);
    const char *token = NULL;
    char fresh[MT_STORE_TOKEN_HEX_LEN] = "";
    bool hosting = env->source == MT_ENV_SINGLE || (rt->rank == 0 && !env->store_hosted);
    /* Every rank may hold a store connection, UCX endpoints and files: whatever the hard limit
     * allows, so that a large job does not meet a low soft limit halfway through. */
    MT_TRY(mt_fd_limit_raise(0, NULL, NULL));
    if (hosting) {
        MT_TRY(host_store(rt, host, sizeof host, &token, fresh));
        /* The host connects to the address its server listens on: MASTER_ADDR may resolve to
         * another interface, or to loopback, where nothing listens. */
        port = mt_store_server_port(rt->server);
    } else if (strlen(env->master_addr) >= sizeof host) {
        return mt_error(MT_ERR_INVALID_ARG, "MASTER_ADDR '%s' is too long", env->master_addr);
    }
    snprintf(rt->store_addr, sizeof rt->store_addr, "%s:%d", env->master_addr, port);
    mt_status st = mt_store_connect_token(host, port, env->job_id, mt_version(), token,
                                          rt->timeout, &rt->store);
    OPENSSL_cleanse(fresh, sizeof fresh);
    MT_TRY(st);
    /* A restarted job's rounds share the launcher's store: each round keeps to its own keys. */
    return mt_store_set_prefix(rt->store, env->store_prefix);
}

static mt_status check_world_size(mt_runtime *rt) {
    char mine[64];
    int n = snprintf(mine, sizeof mine, "%d %d", rt->world, rt->rank);
    void *cur = NULL;
    MT_TRY(mt_store_compare_set(rt->store, "mt/world_size", "", 0, mine, (size_t)n, &cur, NULL));
    int world = -1, first = -1;
    bool parsed = sscanf(cur, "%d %d", &world, &first) == 2;
    free(cur);
    if (!parsed)
        return mt_error(MT_ERR_PROTOCOL, "the store at %s holds a malformed world size record",
                        rt->store_addr);
    if (world != rt->world)
        return mt_error(MT_ERR_MISMATCH, "world size mismatch: rank %d has WORLD_SIZE=%d, but rank "
                        "%d joined with WORLD_SIZE=%d; every process of job '%s' must agree",
                        rt->rank, rt->world, first, world, rt->env.job_id);
    return MT_OK;
}

static mt_status check_duplicate_rank(mt_runtime *rt) {
    char key[64], mine[MT_ENV_HOST_MAX + 64], hostname[MT_ENV_HOST_MAX] = "?";
    gethostname(hostname, sizeof hostname - 1);
    snprintf(key, sizeof key, "mt/rank/%d", rt->rank);
    int n = snprintf(mine, sizeof mine, "pid %ld on %s", (long)getpid(), hostname);
    void *cur = NULL;
    MT_TRY(mt_store_compare_set(rt->store, key, "", 0, mine, (size_t)n, &cur, NULL));
    bool same = strcmp(cur, mine) == 0;
    mt_status st = same ? MT_OK
                        : mt_error(MT_ERR_MISMATCH, "duplicate rank: RANK=%d is claimed by this "
                                   "process (%s) and by another (%s)", rt->rank, mine,
                                   (const char *)cur);
    free(cur);
    return st;
}

static mt_status publish_identity(mt_runtime *rt) {
    char hostname[MT_ENV_HOST_MAX] = "localhost";
    if (gethostname(hostname, sizeof hostname - 1) != 0)
        mt_log(MT_LOG_WARN, "gethostname failed (%s); using 'localhost'", strerror(errno));
    hostname[sizeof hostname - 1] = '\0';
    if (rt->env.node_rank >= 0)
        snprintf(rt->host, sizeof rt->host, "%s/%d", hostname, rt->env.node_rank);
    else
        snprintf(rt->host, sizeof rt->host, "%s", hostname);
    char key[64];
    snprintf(key, sizeof key, "mt/host/%d", rt->rank);
    return mt_store_set(rt->store, key, rt->host, strlen(rt->host));
}

static mt_status fetch_identities(mt_runtime *rt) {
    rt->hosts = calloc((size_t)rt->world, sizeof *rt->hosts);
    if (!rt->hosts) return mt_error(MT_ERR_OUT_OF_MEMORY, "host table for %d ranks", rt->world);
    for (int r = 0; r < rt->world; r++) {
        char key[64];
        snprintf(key, sizeof key, "mt/host/%d", r);
        void *v = NULL;
        MT_TRY(mt_store_get(rt->store, key, rt->timeout, &v, NULL));
        rt->hosts[r] = v;
    }
    return MT_OK;
}

/* Local rank = index among the ranks with the same identity, in rank order. */
static mt_status derive_locality(mt_runtime *rt) {
    rt->local_rank = rt->local_world = 0;
    int nodes = 0, my_node = -1;
    for (int r = 0; r < rt->world; r++) {
        bool first_of_host = true;
        for (int q = 0; q < r && first_of_host; q++)
            if (strcmp(rt->hosts[q], rt->hosts[r]) == 0) first_of_host = false;
        if (first_of_host) {
            if (strcmp(rt->hosts[r], rt->host) == 0) my_node = nodes;
            nodes++;
        }
        if (strcmp(rt->hosts[r], rt->host) == 0) {
            if (r < rt->rank) rt->local_rank++;
            rt->local_world++;
        }
    }
    rt->num_nodes = nodes;
    rt->node_rank = rt->env.node_rank >= 0 ? rt->env.node_rank : my_node;
    const mt_runtime_env *env = &rt->env;
    if (env->local_rank >= 0 && env->local_rank != rt->local_rank)
        return mt_error(MT_ERR_MISMATCH, "LOCAL_RANK=%d disagrees with host identities: rank %d is "
                        "local rank %d of the %d ranks on host '%s'", env->local_rank, rt->rank,
                        rt->local_rank, rt->local_world, rt->host);
    if (env->local_world_size > 0 && env->local_world_size != rt->local_world)
        return mt_error(MT_ERR_MISMATCH, "LOCAL_WORLD_SIZE=%d disagrees with host identities: "
                        "host '%s' has %d ranks", env->local_world_size, rt->host,
                        rt->local_world);
    if (env->num_nodes > 0 && env->num_nodes != nodes)
        mt_log(MT_LOG_WARN, "the launcher says %d node(s) but the ranks report %d distinct "
               "host identities; using %d", env->num_nodes, nodes, nodes);
    return MT_OK;
}

static mt_status join(mt_runtime *rt) {
    MT_TRY(check_world_size(rt));
    MT_TRY(check_duplicate_rank(rt));
    MT_TRY(publish_identity(rt));
    MT_TRY(mt_store_barrier_abortable(rt->store, "init", rt->rank, rt->world, rt->timeout,
                                      MT_JOB_ABORT_KEY));
    MT_TRY(fetch_identities(rt));
    MT_TRY(derive_locality(rt));
    /* A locality disagreement on one rank must stop the others before the transport, which
     * would otherwise wait for that rank's address until the timeout. */
    return mt_store_barrier_abortable(rt->store, "init-checked", rt->rank, rt->world,
                                      rt->timeout, MT_JOB_ABORT_KEY);
}

/* ---- device and transport ------------------------------------------------------------------ */

static mt_status open_device(mt_runtime *rt) {
    const char *want = getenv("MT_DEVICE");
    mt_device_kind kind;
    if (!want || !*want || !strcasecmp(want, "auto")) {
        char why[256];
        kind = mt_device_cuda_count(why, sizeof why) > 0 ? MT_DEVICE_CUDA : MT_DEVICE_CPU;
        /* One notice for the job rather than one per rank: every rank that falls back does so
         * for the same reason (the others' hosts say so at info level). */
#ifdef MT_HAVE_CUDA
        if (kind == MT_DEVICE_CPU && rt->local_rank == 0)
            mt_log(rt->rank == 0 ? MT_LOG_WARN : MT_LOG_INFO, "no CUDA GPU found (%s); the "
                   "ranks of this host use the CPU device", why);
#endif
    } else if (!strcasecmp(want, "cpu")) {
        kind = MT_DEVICE_CPU;
    } else if (!strcasecmp(want, "cuda")) {
        kind = MT_DEVICE_CUDA;
    } else {
        return mt_error(MT_ERR_INVALID_ARG, "MT_DEVICE='%s' is not cpu, cuda or auto", want);
    }
    /* GPU local_rank, shared round-robin when a host runs more ranks than it has GPUs (as the
     * mesh's placement does; NCCL then needs NCCL_MULTI_RANK_GPU_ENABLE=1). The mesh may move
     * the rank to another GPU before anything is allocated. */
    int index = 0;
    if (kind == MT_DEVICE_CUDA) {
        int count = mt_device_cuda_count(NULL, 0);
        index = count > 0 ? rt->local_rank % count : rt->local_rank;
        /* NCCL connects peers lazily by default, allocating its buffers in the first
         * collectives. Connecting when the mesh creates the communicators instead puts that
         * memory where it is measured and charged to comm, and an out-of-memory there shows at
         * mesh creation, not in the middle of a step. A user's own value wins. Set here, before
         * the transport's threads start, because setenv is not safe beside a getenv. */
        setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    }
    mt_status st = mt_device_open(kind, index, &rt->device);
    if (st != MT_OK) return mt_error_wrap(st, "opening the device of local rank %d", rt->local_rank);
    return MT_OK;
}

/* Points UCX's network transports at the interface the job listens on (UCX_NET_DEVICES, unless
 * the user set it): MT_SOCKET_IFNAME; loopback for a single-host job; else the interface that
 * reaches the store's address. Without this UCX's TCP listeners open on every interface. */
static void apply_ucx_devices(const mt_runtime *rt) {
    const char *ifname = getenv("MT_SOCKET_IFNAME");
    const char *ucx = getenv("UCX_NET_DEVICES");
    if (ucx && *ucx) {
        mt_log(MT_LOG_DEBUG, "UCX_NET_DEVICES=%s is set; left as it is", ucx);
        return;
    }
    char name[64] = "lo", addr[64];
    if (ifname && *ifname) {
        snprintf(name, sizeof name, "%s", ifname);
    } else if (!single_host(&rt->env)) {
        mt_status st = mt_netif_route_source(rt->env.master_addr, addr, sizeof addr);
        if (st == MT_OK && mt_netif_is_loopback(addr) && !mt_netif_is_loopback(rt->env.master_addr))
            /* MASTER_ADDR is a name of this host mapped to loopback: which interface the other
             * nodes come in by is unknown here (mt_netif_store_bind warned). */
            return;
        if (st == MT_OK) st = mt_netif_name_of(addr, name, sizeof name);
        if (st != MT_OK) {
            mt_log(MT_LOG_WARN, "UCX may listen on every interface: %s", mt_last_error());
            return;
        }
    }
    /* UCX reads its configuration when the context is created, right after this. */
    setenv("UCX_NET_DEVICES", name, 0);
}

static mt_status start_transport(mt_runtime *rt) {
    apply_ucx_devices(rt);
    MT_TRY(mt_transport_create(rt, &rt->transport));
    return mt_transport_world_group(rt, rt->transport, &rt->world_group);
}

/* ---- init / finalize ----------------------------------------------------------------------- */

static void log_summary(const mt_runtime *rt) {
    if (rt->rank != 0 || !mt_log_enabled(MT_LOG_INFO)) return;
    mt_log(MT_LOG_INFO, "meshtrain %s: %d rank(s) on %d node(s), job '%s', store %s (%s), "
           "launch from %s, device %s", mt_version(), rt->world, rt->num_nodes, rt->env.job_id,
           rt->store_addr, rt->server ? "hosted by rank 0" : "hosted by the launcher",
           mt_env_source_name(rt->env.source), mt_device_name(rt->device));
}

/* What the rank really runs on, whoever bound it (mtrun --bind, taskset, a batch system): the
 * line that answers "is my rank where I think it is?". */
static void log_affinity(const mt_runtime *rt) {
    if (!mt_log_enabled(MT_LOG_INFO)) return;
    enum { MAX_CPUS = 8192 };
    cpu_set_t *set = CPU_ALLOC(MAX_CPUS);
    size_t size = CPU_ALLOC_SIZE(MAX_CPUS);
    uint32_t *words = calloc(MAX_CPUS / 32, sizeof *words);
    char *list = NULL;
    if (set && words && sched_getaffinity(0, size, set) == 0) {
        for (int c = 0; c < MAX_CPUS; c++)
            if (CPU_ISSET_S(c, size, set)) words[c / 32] |= 1u << (c % 32);
        if (mt_topo_cpulist(words, MAX_CPUS / 32, &list) != MT_OK) list = NULL;
    }
    if (list)
        mt_log(MT_LOG_INFO, "local rank %d of host %s runs on cpus %s (%d cpu(s))",
               rt->local_rank, rt->host, list, CPU_COUNT_S(size, set));
    else
        mt_log(MT_LOG_INFO, "local rank %d: the CPU affinity cannot be read (%s)", rt->local_rank,
               set && words ? strerror(errno) : "out of memory");
    free(list);
    free(words);
    if (set) CPU_FREE(set);
}

/* linger_s bounds how long a store host waits for the others to leave its store. */
static void teardown(mt_runtime *rt, double linger_s) {
    mt_comm_set_abort_probe(NULL, NULL);
    if (rt->transport) mt_transport_destroy(rt->transport);
    if (rt->device) mt_device_close(rt->device);
    mt_store_close(rt->store);
    if (rt->server) {
        /* The others may still be using the store; wait (bounded) until they have left. */
        linger_for_clients(rt->server, linger_s);
        mt_store_server_stop(rt->server);
    }
    mt_topo_destroy(rt->topo);
    if (rt->hosts)
        for (int r = 0; r < rt->world; r++) free(rt->hosts[r]);
    free(rt->hosts);
    free(rt);
}

mt_status mt_init(mt_runtime **out, int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (!out) return mt_error(MT_ERR_INVALID_ARG, "mt_init: out must not be NULL");
    *out = NULL;
    mt_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return mt_error(MT_ERR_OUT_OF_MEMORY, "mt_init: out of memory");
    mt_status st = mt_runtime_env_from_process(&rt->env);
    if (st != MT_OK) {
        free(rt);
        return mt_error_wrap(st, "mt_init: bad launch environment");
    }
    rt->rank = rt->env.rank;
    rt->world = rt->env.world_size;
    rt->local_rank = rt->env.local_rank;
    rt->node_rank = rt->env.node_rank;
    mt_log_set_rank(rt->rank);
    st = mt_timeout_from_env(&rt->timeout);
    if (st != MT_OK) {
        free(rt);
        return mt_error_wrap(st, "mt_init");
    }

    /* The rank's thread pool before any product: it sets OpenBLAS's thread count, and a bad
     * MT_NUM_THREADS fails here, like a bad launch variable. */
    mt_thread_pool *pool = NULL;
    st = mt_thread_pool_get(&pool);
    if (st != MT_OK) {
        free(rt);
        return mt_error_wrap(st, "mt_init");
    }
    mt_log(MT_LOG_DEBUG, "rank %d: %d thread(s) for host loops and OpenBLAS", rt->rank,
           mt_thread_pool_threads(pool));

    st = open_store(rt);
    if (st == MT_OK) {
        st = join(rt);
        if (st != MT_OK) st = publish_failure(rt, st);
    }
    if (st == MT_OK) st = open_device(rt);
    if (st == MT_OK) {
        st = start_transport(rt);
        char why[1024];
        mt_status cause;
        if (st != MT_OK && job_aborted(rt, &cause, why, sizeof why))
            /* A rank that gave up (and exited) right after its own start makes the others'
             * endpoint creation fail: its message is the cause worth reading. */
            st = mt_error_wrap(cause, "mt_init: the job was aborted: %s; then", why);
    }
    if (st != MT_OK) {
        char saved[2048];
        snprintf(saved, sizeof saved, "%s", mt_last_error());
        teardown(rt, ABORT_LINGER_S);
        return mt_error_restore(st, saved);
    }
    log_summary(rt);
    log_affinity(rt);
    /* From here on a wait that would sleep for a rank that gave up ends with its message. */
    mt_comm_set_abort_probe(job_aborted, rt);
    mt_failure_reset();
    *out = rt;
    return MT_OK;
}

void mt_finalize(mt_runtime *rt) {
    if (!rt) return;
    mt_status failed = MT_OK;
    char why[1024];
    if (mt_failure_pending(&failed, why, sizeof why)) {
        /* The others may be waiting for this rank in a collective it will never issue: do not
         * wait for them in a barrier (they would time out first), tell them instead. */
        mt_log(MT_LOG_WARN, "mt_finalize after an error: not waiting for the other ranks; the "
               "job is aborted (%s)", why[0] ? why : mt_status_str(failed));
        publish_abort(rt, failed, why);
        teardown(rt, ABORT_LINGER_S);
        return;
    }
    /* Every rank is done communicating before endpoints close; bounded by MT_TIMEOUT_S, and
     * ended at once when another rank aborted the job. */
    if (mt_store_barrier_abortable(rt->store, "finalize", rt->rank, rt->world, rt->timeout,
                                   MT_JOB_ABORT_KEY) != MT_OK)
        mt_log(MT_LOG_WARN, "mt_finalize: %s; closing anyway", mt_last_error());
    teardown(rt, rt->timeout);
}

void mt_abort(mt_runtime *rt, mt_status status) {
    if (status == MT_OK) status = MT_ERR_INTERNAL;
    char why[2048];
    snprintf(why, sizeof why, "%s", mt_last_error()[0] ? mt_last_error() : mt_status_str(status));
    mt_log(MT_LOG_ERROR, "aborting the job: %s", why);
    if (rt) {
        publish_abort(rt, status, why);
        /* The store dies with this process: let the others read why first (bounded). */
        if (rt->server) linger_for_clients(rt->server, ABORT_LINGER_S);
    }
    fflush(NULL);
    /* No teardown: the others may be stuck, and the operating system releases everything. */
    _exit((int)status);
}

/* ---- accessors ----------------------------------------------------------------------------- */

int mt_runtime_rank(const mt_runtime *rt) { return rt->rank; }
int mt_runtime_world_size(const mt_runtime *rt) { return rt->world; }
int mt_runtime_local_rank(const mt_runtime *rt) { return rt->local_rank; }
int mt_runtime_local_world_size(const mt_runtime *rt) { return rt->local_world; }
int mt_runtime_node_rank(const mt_runtime *rt) { return rt->node_rank; }
int mt_runtime_num_nodes(const mt_runtime *rt) { return rt->num_nodes; }
const char *mt_runtime_host(const mt_runtime *rt) { return rt->host; }
const char *mt_runtime_job_id(const mt_runtime *rt) { return rt->env.job_id; }
mt_store *mt_runtime_store(mt_runtime *rt) { return rt->store; }
mt_device *mt_runtime_device(mt_runtime *rt) { return rt->device; }
mt_group *mt_runtime_world(mt_runtime *rt) { return rt->world_group; }
double mt_runtime_timeout(const mt_runtime *rt) { return rt->timeout; }
mt_transport *mt_runtime_transport(mt_runtime *rt) { return rt ? rt->transport : NULL; }

mt_status mt_runtime_topology_summary(mt_runtime *rt, char *buf, size_t size) {
    if (!buf || size == 0) return mt_error(MT_ERR_INVALID_ARG, "topology summary: no buffer");
    buf[0] = '\0';
    const mt_topo *t = NULL;
    MT_TRY(mt_runtime_topology(rt, &t));
    size_t len = (size_t)snprintf(buf, size, "%s: %zu package(s), %zu NUMA node(s), %zu core(s), "
                                  "%zu GPU(s)", t->source, t->n_packages, t->n_numa, t->n_cores,
                                  t->n_gpus);
    if (t->n_gpus > 0 && len < size) {
        int *island = malloc(t->n_gpus * sizeof *island);
        size_t n_islands = 0;
        if (island && mt_topo_nvlink_islands(t, island, &n_islands) == MT_OK)
            len += (size_t)snprintf(buf + len, size - len, " in %zu NVLink island(s)%s", n_islands,
                                    t->nvlink_note && *t->nvlink_note ? " (NVLink unknown)" : "");
        free(island);
    }
    if (len < size) len += (size_t)snprintf(buf + len, size - len, ", %zu NIC(s)", t->n_nics);
    for (size_t i = 0; i < t->n_nics && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? " " : ": ", t->nics[i].name);
    return MT_OK;
}

mt_status mt_runtime_use_gpu(mt_runtime *rt, int index) {
    if (!rt || !rt->device || mt_device_get_kind(rt->device) != MT_DEVICE_CUDA || index < 0 ||
        mt_device_index(rt->device) == index)
        return MT_OK;
    mt_mem_stats stats;
    mt_device_mem_stats(rt->device, &stats);
    if (stats.total_current > 0) {
        char held[32];
        return mt_error(MT_ERR_INVALID_ARG, "cannot move local rank %d from %s to GPU %d: %s are "
                        "allocated on it; create the mesh before allocating device memory",
                        rt->local_rank, mt_device_name(rt->device), index,
                        mt_format_bytes(stats.total_current, held, sizeof held));
    }
    mt_device *dev = NULL;
    mt_status st = mt_device_open(MT_DEVICE_CUDA, index, &dev);
    if (st != MT_OK) return mt_error_wrap(st, "moving local rank %d to GPU %d", rt->local_rank,
                                          index);
    mt_device_close(rt->device);
    rt->device = dev;
    return MT_OK;
}

mt_status mt_runtime_topology(mt_runtime *rt, const mt_topo **out) {
    if (!rt || !out) return mt_error(MT_ERR_INVALID_ARG, "mt_runtime_topology: NULL argument");
    *out = NULL;
    if (!rt->topo) {
        mt_status st = mt_topo_open(&rt->topo);
        if (st != MT_OK) {
            if (mt_topo_file_env()) return st; /* the message names MT_TOPO_FILE and the file */
            return mt_error_wrap(st, "discovering the topology of host %s", rt->host);
        }
    }
    *out = rt->topo;
    return MT_OK;
}

const char *mt_runtime_host_of(const mt_runtime *rt, int rank) {
    if (!rt || !rt->hosts || rank < 0 || rank >= rt->world || !rt->hosts[rank]) return NULL;
    return rt->hosts[rank];
}
