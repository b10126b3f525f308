/* The store's frame encoding and the request parser. The parser is the only code that reads bytes
 * a remote peer chose, so it checks every length against what is left before touching it. */
#include "store/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint32_t mt_store_get_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

void mt_store_put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* ---- writing ------------------------------------------------------------------------------- */

static void buf_reserve(mt_store_buf *b, size_t extra) {
    if (b->failed) return;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->failed = true;
        return;
    }
    size_t need = b->len + extra;
    if (need <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    uint8_t *data = realloc(b->data, cap);
    if (!data) {
        b->failed = true;
        return;
    }
    b->data = data;
    b->cap = cap;
}

static void buf_append(mt_store_buf *b, const void *src, size_t n) {
    buf_reserve(b, n);
    if (b->failed) return;
    if (n) memcpy(b->data + b->len, src, n);
    b->len += n;
}

void mt_store_buf_begin(mt_store_buf *b, uint8_t code) {
    b->len = 0;
    b->failed = false;
    uint8_t head[5] = {0, 0, 0, 0, code};
    buf_append(b, head, sizeof head);
}

void mt_store_buf_u8(mt_store_buf *b, uint8_t v) { buf_append(b, &v, 1); }

void mt_store_buf_u32(mt_store_buf *b, uint32_t v) {
    uint8_t p[4];
    mt_store_put_be32(p, v);
    buf_append(b, p, 4);
}

void mt_store_buf_u64(mt_store_buf *b, uint64_t v) {
    mt_store_buf_u32(b, (uint32_t)(v >> 32));
    mt_store_buf_u32(b, (uint32_t)v);
}

void mt_store_buf_bytes(mt_store_buf *b, const void *data, size_t len) {
    if (len > UINT32_MAX) {
        b->failed = true;
        return;
    }
    mt_store_buf_u32(b, (uint32_t)len);
    buf_append(b, data, len);
}

void mt_store_buf_raw(mt_store_buf *b, const void *data, size_t len) { buf_append(b, data, len); }

void mt_store_buf_str(mt_store_buf *b, const char *s) { mt_store_buf_bytes(b, s, strlen(s)); }

bool mt_store_buf_finish(mt_store_buf *b) {
    if (b->failed || b->len < 4 || b->len - 4 > UINT32_MAX) return false;
    mt_store_put_be32(b->data, (uint32_t)(b->len - 4));
    return true;
}

void mt_store_buf_free(mt_store_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---- reading ------------------------------------------------------------------------------- */

uint8_t mt_store_read_u8(mt_store_reader *r) {
    if (r->bad || r->left < 1) {
        r->bad = true;
        return 0;
    }
    uint8_t v = r->p[0];
    r->p++;
    r->left--;
    return v;
}

uint32_t mt_store_read_u32(mt_store_reader *r) {
    if (r->bad || r->left < 4) {
        r->bad = true;
        return 0;
    }
    uint32_t v = mt_store_get_be32(r->p);
    r->p += 4;
    r->left -= 4;
    return v;
}

uint64_t mt_store_read_u64(mt_store_reader *r) {
    uint64_t hi = mt_store_read_u32(r);
    uint64_t lo = mt_store_read_u32(r);
    return hi << 32 | lo;
}

mt_store_bytes mt_store_read_bytes(mt_store_reader *r, size_t max) {
    mt_store_bytes out = {NULL, 0};
    uint32_t len = mt_store_read_u32(r);
    if (r->bad || len > max || len > r->left) {
        r->bad = true;
        return out;
    }
    out.data = r->p;
    out.len = len;
    r->p += len;
    r->left -= len;
    return out;
}

/* ---- requests ------------------------------------------------------------------------------ */

static bool fail(char *why, size_t cap, const char *msg) {
    snprintf(why, cap, "%s", msg);
    return false;
}

/* A length-prefixed byte string of at most max bytes; what ("key", "value") names it in why. */
static bool read_string(mt_store_reader *r, const char *what, size_t max, mt_store_bytes *out,
                        char *why, size_t cap) {
    uint32_t len = r->left >= 4 ? mt_store_get_be32(r->p) : 0;
    if (r->left >= 4 && len > max) {
        snprintf(why, cap, "%s of %u bytes is over the limit of %zu", what, len, max);
        return false;
    }
    *out = mt_store_read_bytes(r, max);
    if (r->bad) {
        snprintf(why, cap, "truncated %s", what);
        return false;
    }
    return true;
}

static bool read_key(mt_store_reader *r, mt_store_bytes *key, char *why, size_t cap) {
    if (!read_string(r, "key", MT_STORE_MAX_KEY, key, why, cap)) return false;
    if (key->len == 0) return fail(why, cap, "empty key");
    return true;
}

static bool read_value(mt_store_reader *r, mt_store_bytes *value, char *why, size_t cap) {
    return read_string(r, "value", MT_STORE_MAX_VALUE, value, why, cap);
}

static bool parse_wait(mt_store_reader *r, mt_store_request *req, char *why, size_t cap) {
    uint8_t any = mt_store_read_u8(r);
    req->any = any == 1;
    req->timeout_ms = mt_store_read_u64(r);
    req->nkeys = mt_store_read_u32(r);
    if (r->bad) return fail(why, cap, "truncated wait request");
    if (any > 1) return fail(why, cap, "wait request with a mode other than all (0) or any (1)");
    if (req->nkeys == 0 || req->nkeys > MT_STORE_MAX_WAIT_KEYS)
        return fail(why, cap, "wait request with no keys or too many keys");
    req->keys_at = r->p;
    for (uint32_t i = 0; i < req->nkeys; i++) {
        mt_store_bytes key;
        if (!read_key(r, &key, why, cap)) return false;
    }
    req->keys_len = (size_t)(r->p - req->keys_at);
    return true;
}

bool mt_store_parse_request(const uint8_t *payload, size_t len, mt_store_request *req, char *why,
                            size_t why_cap) {
    memset(req, 0, sizeof *req);
    if (len > MT_STORE_MAX_FRAME) return fail(why, why_cap, "frame over the size limit");
    mt_store_reader r = {payload, len, false};
    uint8_t op = mt_store_read_u8(&r);
    if (r.bad) return fail(why, why_cap, "empty frame");
    req->op = (mt_store_op)op;
    bool ok = true;
    switch (op) {
    case MT_STORE_OP_HELLO:
        req->magic = mt_store_read_u32(&r);
        req->format = mt_store_read_u32(&r);
        if (!r.bad && req->magic != MT_STORE_MAGIC)
            return fail(why, why_cap, "handshake with a wrong magic number (not a meshtrain client)");
        if (!r.bad && req->format != MT_STORE_HANDSHAKE_FORMAT) {
            snprintf(why, why_cap, "handshake format %u, this store speaks %u (an older or newer "
                     "meshtrain)", req->format, MT_STORE_HANDSHAKE_FORMAT);
            return false;
        }
        req->nonce = mt_store_read_bytes(&r, MT_STORE_NONCE_LEN);
        if (r.bad || req->nonce.len != MT_STORE_NONCE_LEN)
            return fail(why, why_cap, "malformed handshake");
        break;
    case MT_STORE_OP_AUTH: {
        const uint8_t *start = r.p;
        req->proto = mt_store_read_u32(&r);
        req->version = mt_store_read_bytes(&r, MT_STORE_MAX_VERSION);
        req->job_id = mt_store_read_bytes(&r, MT_STORE_MAX_JOB_ID);
        req->signed_part = (mt_store_bytes){start, (size_t)(r.p - start)};
        req->mac = mt_store_read_bytes(&r, MT_STORE_MAC_LEN);
        if (r.bad || req->mac.len != MT_STORE_MAC_LEN)
            return fail(why, why_cap, "malformed authentication");
        break;
    }
    case MT_STORE_OP_STATS:
        break;
    case MT_STORE_OP_SET:
        ok = read_key(&r, &req->key, why, why_cap) && read_value(&r, &req->value, why, why_cap);
        break;
    case MT_STORE_OP_GET:
        ok = read_key(&r, &req->key, why, why_cap);
        req->timeout_ms = mt_store_read_u64(&r);
        if (ok && r.bad) return fail(why, why_cap, "truncated get request");
        break;
    case MT_STORE_OP_TRY_GET:
    case MT_STORE_OP_DELETE:
        ok = read_key(&r, &req->key, why, why_cap);
        break;
    case MT_STORE_OP_ADD:
        ok = read_key(&r, &req->key, why, why_cap);
        req->delta = (int64_t)mt_store_read_u64(&r);
        if (ok && r.bad) return fail(why, why_cap, "truncated add request");
        break;
    case MT_STORE_OP_CAS:
        ok = read_key(&r, &req->key, why, why_cap) &&
             read_value(&r, &req->expected, why, why_cap) &&
             read_value(&r, &req->value, why, why_cap);
        break;
    case MT_STORE_OP_WAIT:
        ok = parse_wait(&r, req, why, why_cap);
        break;
    default:
        snprintf(why, why_cap, "unknown opcode %u", op);
        return false;
    }
    if (!ok) return false;
    if (r.left != 0) return fail(why, why_cap, "trailing bytes after the request");
    return true;
}

bool mt_store_next_wait_key(const mt_store_request *req, size_t *pos, mt_store_bytes *key) {
    if (*pos >= req->keys_len) return false;
    mt_store_reader r = {req->keys_at + *pos, req->keys_len - *pos, false};
    *key = mt_store_read_bytes(&r, MT_STORE_MAX_KEY);
    if (r.bad) return false;
    *pos = req->keys_len - r.left;
    return true;
}
