/* The rendezvous store server's key-value map: FNV-1a hashed, chained buckets, doubled when the
 * map holds as many keys as it has buckets. */
#include "store/kv.h"

#include <stdlib.h>
#include <string.h>

struct mt_store_kv_entry {
    struct mt_store_kv_entry *next;
    uint64_t hash;
    size_t klen, vlen;
    uint8_t *key, *value;
};

typedef mt_store_kv_entry entry;

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* The link that points at key's entry, or the empty link at the end of its bucket. */
static entry **slot_of(const mt_store_kv *m, mt_store_bytes key, uint64_t h) {
    entry **slot = &m->buckets[h & (m->nbuckets - 1)];
    while (*slot && !((*slot)->hash == h && (*slot)->klen == key.len &&
                      memcmp((*slot)->key, key.data, key.len) == 0))
        slot = &(*slot)->next;
    return slot;
}

static entry *find(const mt_store_kv *m, mt_store_bytes key) {
    if (!m->nbuckets) return NULL;
    return *slot_of(m, key, hash_bytes(key.data, key.len));
}

static bool grow(mt_store_kv *m) {
    size_t n = m->nbuckets ? m->nbuckets * 2 : 64;
    entry **b = calloc(n, sizeof *b);
    if (!b) return false;
    for (size_t i = 0; i < m->nbuckets; i++) {
        for (entry *e = m->buckets[i], *next; e; e = next) {
            next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = n;
    return true;
}

/* What an entry costs against the byte cap: its key, its value and its bookkeeping. */
static size_t entry_bytes(size_t klen, size_t vlen) { return klen + vlen + sizeof(entry); }

size_t mt_store_kv_bytes_after_put(const mt_store_kv *m, mt_store_bytes key, size_t len) {
    const entry *e = find(m, key);
    return e ? m->bytes - e->vlen + len : m->bytes + entry_bytes(key.len, len);
}

bool mt_store_kv_get(const mt_store_kv *m, mt_store_bytes key, mt_store_bytes *value) {
    const entry *e = find(m, key);
    if (e && value) *value = (mt_store_bytes){e->value, e->vlen};
    return e != NULL;
}

bool mt_store_kv_put(mt_store_kv *m, mt_store_bytes key, const void *value, size_t len) {
    /* A failed grow only matters when there are no buckets at all: chains just get longer. */
    if (m->count >= m->nbuckets && !grow(m) && !m->nbuckets) return false;
    uint64_t h = hash_bytes(key.data, key.len);
    entry **slot = slot_of(m, key, h);
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) return false;
    if (len) memcpy(copy, value, len);
    entry *e = *slot;
    if (!e) {
        e = calloc(1, sizeof *e);
        uint8_t *k = malloc(key.len);
        if (!e || !k) {
            free(e);
            free(k);
            free(copy);
            return false;
        }
        memcpy(k, key.data, key.len);
        e->key = k;
        e->klen = key.len;
        e->hash = h;
        *slot = e;
        m->count++;
        m->bytes += entry_bytes(key.len, 0);
    } else {
        free(e->value);
        m->bytes -= e->vlen;
    }
    m->bytes += len;
    e->value = copy;
    e->vlen = len;
    return true;
}

bool mt_store_kv_delete(mt_store_kv *m, mt_store_bytes key) {
    if (!m->nbuckets) return false;
    entry **slot = slot_of(m, key, hash_bytes(key.data, key.len));
    entry *e = *slot;
    if (!e) return false;
    *slot = e->next;
    m->bytes -= entry_bytes(e->klen, e->vlen);
    free(e->key);
    free(e->value);
    free(e);
    m->count--;
    return true;
}

void mt_store_kv_free(mt_store_kv *m) {
    for (size_t i = 0; i < m->nbuckets; i++) {
        for (entry *e = m->buckets[i], *next; e; e = next) {
            next = e->next;
            free(e->key);
            free(e->value);
            free(e);
        }
    }
    free(m->buckets);
    memset(m, 0, sizeof *m);
}

bool mt_store_kv_wait_done(const mt_store_kv *m, const mt_store_request *req, uint32_t *index) {
    size_t pos = 0;
    mt_store_bytes key;
    for (uint32_t i = 0; mt_store_next_wait_key(req, &pos, &key); i++) {
        bool present = find(m, key) != NULL;
        if (req->any && present) {
            *index = i;
            return true;
        }
        if (!req->any && !present) return false;
    }
    *index = 0;
    return !req->any;
}
