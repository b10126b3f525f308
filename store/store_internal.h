/* Internal: the rendezvous store's functions beyond include/meshtrain/store.h, for the runtime
 * (mesh/runtime.c), mtrun and the tests: a client playing another build, waits on any of several
 * keys, abortable barriers, the server's client count. The client (store/client.c) and the server
 * (store/server.c) implement them; the wire format is store/wire.h. */
#ifndef MT_STORE_STORE_INTERNAL_H
#define MT_STORE_STORE_INTERNAL_H

#include <meshtrain/status.h>
#include <meshtrain/store.h>

#include <stddef.h>

/* Client connect with an explicit meshtrain version string: the tests use it to play a client of
 * another build. mt_store_connect passes mt_version(). */
mt_status mt_store_connect_version(const char *host, int port, const char *job_id,
                                   const char *version, double timeout_s, mt_store **out);

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

/* mt_store_server_start that also says why the port could not be listened on: *listen_err is
 * that errno (EADDRINUSE: the port is taken), 0 when the failure was another one. */
mt_status mt_store_server_start_err(const char *bind_addr, int port, const char *job_id,
                                    mt_store_server **out, int *listen_err);

/* Number of clients currently connected to a server (the runtime waits for them to leave before
 * stopping its server; tests). */
int mt_store_server_clients(mt_store_server *server);

#endif
