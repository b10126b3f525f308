/* Rendezvous store: a TCP key-value store in the spirit of PyTorch's TCPStore.
 *
 * node 0's mtrun (or rank 0 when a program starts without mtrun) hosts the server; every process
 * connects as a client. Every connection first proves that it knows the job's store token
 * (MT_STORE_TOKEN, read by mt_store_server_start and mt_store_connect; none when unset) with an
 * HMAC-SHA256 challenge-response; then the job id and the meshtrain version are compared: a client
 * of another job or another build is refused with a message, a client without the token with
 * nothing (docs/security.md). The server caps its connections (MT_STORE_MAX_CLIENTS, 1024) and the
 * bytes of its keys and values (MT_STORE_MAX_BYTES, 1 GiB). Keys are at most MT_STORE_MAX_KEY bytes,
 * values at most MT_STORE_MAX_VALUE bytes. Every blocking call takes a timeout in seconds; a
 * negative timeout means the default, MT_TIMEOUT_S (300 when unset).
 *
 * A client handle may be used from several threads; its requests are serialized.
 */
#ifndef MESHTRAIN_STORE_H
#define MESHTRAIN_STORE_H

#include <meshtrain/api.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MT_STORE_MAX_KEY 1024
#define MT_STORE_MAX_VALUE (64u << 20)

typedef struct mt_store_server mt_store_server;
typedef struct mt_store mt_store;

/* Starts a server on bind_addr:port (NULL or "" = all interfaces; port 0 = a free port) that
 * serves on its own thread and admits only clients of job_id that know MT_STORE_TOKEN. A bad
 * MT_STORE_TOKEN, MT_STORE_MAX_CLIENTS or MT_STORE_MAX_BYTES is an error naming it. */
MT_API mt_status mt_store_server_start(const char *bind_addr, int port, const char *job_id,
                                       mt_store_server **out);

/* The port the server listens on. */
MT_API int mt_store_server_port(const mt_store_server *server);

/* Stops the server and closes every connection. */
MT_API void mt_store_server_stop(mt_store_server *server);

/* Connects to host:port as a client of job_id, retrying until timeout_s so that servers and
 * clients may start in any order. */
MT_API mt_status mt_store_connect(const char *host, int port, const char *job_id, double timeout_s,
                                  mt_store **out);

/* Closes the connection. */
MT_API void mt_store_close(mt_store *store);

/* Sets key to value (replacing it) and wakes its waiters. */
MT_API mt_status mt_store_set(mt_store *store, const char *key, const void *value, size_t len);

/* Waits until key exists, then returns a malloc'd copy of its value (caller frees). The value is
 * NUL-terminated one byte past *len for convenience. */
MT_API mt_status mt_store_get(mt_store *store, const char *key, double timeout_s, void **value,
                              size_t *len);

/* Like mt_store_get without waiting: *found says whether key exists (value NULL when not). */
MT_API mt_status mt_store_try_get(mt_store *store, const char *key, void **value, size_t *len,
                                  bool *found);

/* Adds delta to the integer stored at key (a missing key counts as 0) and returns the new value.
 * The value is stored as decimal text, so mt_store_get reads it as e.g. "42". */
MT_API mt_status mt_store_add(mt_store *store, const char *key, int64_t delta, int64_t *result);

/* Atomically: if key's value equals expected (a missing key equals an empty expected), sets it to
 * desired. Returns the value now stored (malloc'd; caller frees; empty when the key is still
 * missing) in *current. */
MT_API mt_status mt_store_compare_set(mt_store *store, const char *key, const void *expected,
                                      size_t expected_len, const void *desired, size_t desired_len,
                                      void **current, size_t *current_len);

/* Waits until every key exists. The timeout error names the keys still missing. */
MT_API
mt_status mt_store_wait(mt_store *store, const char *const *keys, int nkeys, double timeout_s);

/* Deletes key; *existed (may be NULL) says whether it was there. */
MT_API mt_status mt_store_delete(mt_store *store, const char *key, bool *existed);

/* Blocks until all `world` participants (numbered 0..world-1) have entered barrier `name`. The
 * timeout error names the participants that never arrived. A name may be reused once all have
 * left. */
MT_API mt_status mt_store_barrier(mt_store *store, const char *name, int rank, int world,
                                  double timeout_s);

/* The default timeout: MT_TIMEOUT_S seconds, 300 when unset. */
MT_API double mt_default_timeout(void);

#ifdef __cplusplus
}
#endif
#endif
