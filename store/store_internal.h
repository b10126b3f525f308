/* Internal: the rendezvous store's functions beyond include/meshtrain/store.h, for the runtime
 * (mesh/runtime.c), mtrun and the tests: a client playing another build, waits on any of several
 * keys, abortable barriers, the server's client count. The client (store/client.c) and the server
 * (store/server.c) implement them; the wire format is store/wire.h. */
#ifndef MT_STORE_STORE_INTERNAL_H
#define MT_STORE_STORE_INTERNAL_H

#include <meshtrain/status.h>
#include <meshtrain/store.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Client connect with an explicit meshtrain version string: the tests use it to play a client of
 * another build. mt_store_connect passes mt_version(). */
mt_status mt_store_connect_version(const char *host, int port, const char *job_id,
                                   const char *version, double timeout_s, mt_store **out);

/* The most general connect: also the token (NULL: MT_STORE_TOKEN from the environment; "": none).
 * A wrong token fails at once with MT_ERR_MISMATCH, whose message says only that the store
 * refused the handshake (the server tells a client without the token nothing more). */
mt_status mt_store_connect_token(const char *host, int port, const char *job_id,
                                 const char *version, const char *token, double timeout_s,
                                 mt_store **out);

/* Runs the client side of the handshake on a connected socket (tests drive raw connections
 * with it). A refusal is final (*retry false); anything else may be retried. */
mt_status mt_store_client_handshake(int fd, const char *addr, const char *job_id,
                                    const char *version, const char *token, double deadline,
                                    bool *retry);

/* Waits until any of the keys exists; *which is its index and *value (may be NULL; malloc'd,
 * NUL-terminated, caller frees) its value. The timeout error names the keys. */
mt_status mt_store_wait_any(mt_store *store, const char *const *keys, int nkeys, double timeout_s,
                            int *which, void **value, size_t *len);

/* A barrier that also ends, with MT_ERR_MISMATCH and the key's value in the message, when
 * abort_key appears: the runtime uses it so that one rank's join failure stops the others at
 * once instead of after MT_TIMEOUT_S. abort_key may be NULL. */
mt_status mt_store_barrier_abortable(mt_store *store, const char *name, int rank, int world,
                                     double timeout_s, const char *abort_key);

/* Publishes a failure under abort_key (first writer wins) so that abortable barriers end with
 * this status and message. */
mt_status mt_store_abort(mt_store *store, const char *abort_key, mt_status status,
                         const char *message);

/* Reads a value written by mt_store_abort: returns its message (inside value) and sets *status
 * (MT_ERR_INTERNAL when the value carries no valid status). */
const char *mt_store_abort_parse(const char *value, mt_status *status);

/* Every key this client names is sent as prefix + key from now on, so that the rounds of a
 * restarted job (mtrun --max_restarts, MT_STORE_PREFIX) never see each other's keys in the one
 * store that outlives them. The prefix counts towards MT_STORE_MAX_KEY. */
#define MT_STORE_MAX_PREFIX 64
mt_status mt_store_set_prefix(mt_store *store, const char *prefix);

/* Caps how long any request on this connection waits for an answer beyond the server's own
 * wait (default, and never more than, MT_TIMEOUT_S; 0 restores it): mtrun's heartbeat uses a
 * fraction of MT_TIMEOUT_S so that a store host that stopped answering while its kernel still
 * acknowledges (a hung or stopped process) is noticed in time. */
mt_status mt_store_set_answer_limit(mt_store *store, double seconds);

/* MT_TIMEOUT_S (300 when unset), refused with a message naming it when it is not a number of
 * seconds in 0.001..1e8: mt_init and mtrun fail on it, mt_default_timeout warns and uses 300. */
mt_status mt_timeout_from_env(double *out);

/* "host:port" of a client's server, for messages. */
const char *mt_store_address(const mt_store *store);

/* How a server is started (mt_store_server_start_opts). */
typedef struct mt_store_server_opts {
    const char *bind_addr; /* NULL or "": every interface */
    int port;              /* 0: a free port */
    const char *job_id;
    const char *token;     /* NULL: MT_STORE_TOKEN from the environment; "": none */
    int max_clients;       /* connections at once; 0: 1024. MT_STORE_MAX_CLIENTS wins when set */
    uint64_t max_bytes;    /* keys + values; 0: 1 GiB. MT_STORE_MAX_BYTES wins when set */
} mt_store_server_opts;

/* The client limit a job's store gets by default: a connection per rank, three per node's mtrun
 * (its main, heartbeat and watcher connections) and a margin for reconnects and tools. */
int mt_store_default_max_clients(int world, int nnodes);

/* Starts a server; *listen_err is the errno of a failed listen (EADDRINUSE: the port is taken),
 * 0 when the failure was another one. A bad token or MT_STORE_MAX_* is an error that says which. */
mt_status mt_store_server_start_opts(const mt_store_server_opts *opts, mt_store_server **out,
                                     int *listen_err);

/* What a server holds and has held: the bound on its memory that docs/security.md promises is
 * kv + buffered <= MT_STORE_MAX_BYTES + connections x the largest frame each may send. */
typedef struct mt_store_server_stats {
    uint64_t kv_bytes, kv_peak;             /* keys + values + bookkeeping (the capped part) */
    uint64_t buffered_bytes, buffered_peak; /* frames being read and replies being written */
    uint64_t total_peak;                    /* the largest kv + buffered seen at once */
    uint64_t refused;                       /* unauthenticated connections closed */
    uint64_t busy;                          /* connections turned away at the client limit */
    uint32_t clients, clients_peak, max_clients;
    uint64_t max_bytes;
} mt_store_server_stats;

/* The server's counters, from any thread. A client of the job can read the same through
 * mt_store_stats (the STATS request), which a stranger cannot send. */
void mt_store_server_get_stats(mt_store_server *server, mt_store_server_stats *out);
mt_status mt_store_stats(mt_store *store, mt_store_server_stats *out);

/* Number of clients currently connected to a server (the runtime waits for them to leave before
 * stopping its server; tests). */
int mt_store_server_clients(mt_store_server *server);

#endif
