/* Internal: the rendezvous store server's key-value map. Keys and values are byte strings that
 * the map copies and owns. Only the server thread touches it, so it takes no lock.
 */
#ifndef MT_MESH_STORE_KV_H
#define MT_MESH_STORE_KV_H

#include "store/wire.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct mt_store_kv_entry mt_store_kv_entry;

/* A hash map with chained buckets; all zeros is an empty map. */
typedef struct mt_store_kv {
    mt_store_kv_entry **buckets;
    size_t nbuckets, count;
    size_t bytes; /* keys + values + per-entry bookkeeping: what the server's byte cap counts */
} mt_store_kv;

/* m->bytes once key is set to a value of len bytes (the server checks it against its cap). */
size_t mt_store_kv_bytes_after_put(const mt_store_kv *m, mt_store_bytes key, size_t len);

/* Whether key is present; if so and value is not NULL, *value points at the stored value, valid
 * until the key is next changed or deleted. */
bool mt_store_kv_get(const mt_store_kv *m, mt_store_bytes key, mt_store_bytes *value);

/* Replaces (or inserts) key's value with a copy of value. False when out of memory. */
bool mt_store_kv_put(mt_store_kv *m, mt_store_bytes key, const void *value, size_t len);

/* Removes key; false when it was not there. */
bool mt_store_kv_delete(mt_store_kv *m, mt_store_bytes key);

/* Frees every key and value; the map is empty afterwards. */
void mt_store_kv_free(mt_store_kv *m);

/* For a parsed WAIT request: whether the map satisfies it (all keys present, or any key in "any"
 * mode); *index is the first present key's position (0 when none or in "all" mode). */
bool mt_store_kv_wait_done(const mt_store_kv *m, const mt_store_request *req, uint32_t *index);

#endif
