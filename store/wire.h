/* Internal: the rendezvous store's wire format (store/wire.c), shared by the server, the client, the
 * tests and the fuzzer: frames, opcodes, reply codes, limits, the request parser, frame buffers
 * and readers. The store's library-internal functions beyond store.h are in store/store_internal.h.
 *
 * Every message is a frame: a 4-byte big-endian payload length, then the payload. A request's
 * payload starts with an opcode byte, a reply's with a reply code byte; the fields that follow
 * are fixed-size big-endian integers and byte strings (4-byte length, then the bytes). Payloads
 * are bounded by MT_STORE_MAX_FRAME so that a reader can refuse a frame from its length prefix
 * alone; before a client has authenticated, by MT_STORE_MAX_PREAUTH_FRAME.
 *
 * The handshake (docs/security.md) is a challenge-response over the job's token (store/auth.h):
 *   client: HELLO  magic, handshake format, client nonce (32 random bytes)
 *   server: OK     server nonce (32 random bytes)
 *   client: AUTH   proto, version, job id, mac_c
 *                  mac_c = HMAC-SHA256(token, "mtstore-client\0" || nonces || AUTH fields before
 *                  mac_c, as sent)
 *   server: OK mac_s | BAD_VERSION mac_s proto version | BAD_JOB mac_s job id | REFUSED
 *                  mac_s = HMAC-SHA256(token, "mtstore-server\0" || nonces || mac_c)
 * The server checks mac_c (CRYPTO_memcmp) before it looks at the version or the job id, so a
 * client without the token gets the one-byte REFUSED whatever it sent and learns neither. The
 * client checks mac_s before it believes any answer, so a stranger posing as the store cannot
 * feed it keys. A store without a token uses the empty key: the same exchange, no protection.
 * HELLO and AUTH keep their layout across builds (the handshake format); proto and version are
 * compared after authentication, so clients of another build get a clear "mixed builds" error.
 * Only an authenticated client may send any other request.
 */
#ifndef MT_STORE_WIRE_H
#define MT_STORE_WIRE_H

#include <meshtrain/store.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/auth.h"

#define MT_STORE_MAGIC 0x4d545354u /* "MTST" */
/* The layout of HELLO and AUTH; 1 was the unauthenticated HELLO of meshtrain <= 0.3.0. */
#define MT_STORE_HANDSHAKE_FORMAT 2u
#define MT_STORE_PROTO_VERSION 2u
#define MT_STORE_MAX_JOB_ID 255
#define MT_STORE_MAX_VERSION 64
/* WAIT takes at most this many keys (bounded so a frame cannot ask for unbounded work). */
#define MT_STORE_MAX_WAIT_KEYS 65536
/* compare_set carries two values and a key; nothing else is larger. */
#define MT_STORE_MAX_FRAME ((size_t)2 * MT_STORE_MAX_VALUE + MT_STORE_MAX_KEY + 64)
/* Before authentication a frame is at most this long (AUTH, the largest, is under 400 bytes):
 * a stranger cannot make the server buffer more than this per connection. */
#define MT_STORE_MAX_PREAUTH_FRAME 1024u

typedef enum mt_store_op {
    MT_STORE_OP_HELLO = 1,   /* u32 magic, u32 handshake format, 32-byte client nonce */
    MT_STORE_OP_SET = 2,     /* key, value */
    MT_STORE_OP_GET = 3,     /* key, u64 timeout ms (server-side wait) */
    MT_STORE_OP_TRY_GET = 4, /* key */
    MT_STORE_OP_ADD = 5,     /* key, i64 delta */
    MT_STORE_OP_CAS = 6,     /* key, expected, desired */
    MT_STORE_OP_WAIT = 7,    /* u8 any, u64 timeout ms, u32 n, n keys; reply u32 index (+ the
                              * value of that key in any mode) */
    MT_STORE_OP_DELETE = 8,  /* key */
    MT_STORE_OP_AUTH = 9,    /* u32 proto, str version, str job id, 32-byte mac_c */
    MT_STORE_OP_STATS = 10   /* reply: the server's memory and clients (mt_store_server_stats) */
} mt_store_op;

typedef enum mt_store_reply {
    MT_STORE_R_OK = 0,          /* op-specific fields follow */
    MT_STORE_R_NOT_FOUND = 1,   /* try_get: no such key */
    MT_STORE_R_TIMEOUT = 2,     /* get/wait: deadline passed; wait: u32 n + the missing keys */
    MT_STORE_R_ERROR = 3,       /* str message (e.g. add on a non-integer value) */
    MT_STORE_R_BAD_JOB = 4,     /* auth: mac_s, str the server's job id */
    MT_STORE_R_BAD_VERSION = 5, /* auth: mac_s, u32 server proto, str server version */
    MT_STORE_R_REFUSED = 6,     /* handshake refused; nothing follows, whatever the reason */
    MT_STORE_R_BUSY = 7         /* the server is at its client limit; nothing follows */
} mt_store_reply;

/* A byte string inside a frame (not NUL-terminated). */
typedef struct mt_store_bytes {
    const uint8_t *data;
    size_t len;
} mt_store_bytes;

/* A parsed request; byte strings point into the frame it was parsed from. */
typedef struct mt_store_request {
    mt_store_op op;
    mt_store_bytes key;
    mt_store_bytes value;    /* SET value, CAS desired */
    mt_store_bytes expected; /* CAS expected */
    int64_t delta;           /* ADD */
    uint64_t timeout_ms;     /* GET, WAIT */
    bool any;                /* WAIT: done when any key exists instead of all */
    uint32_t magic, format;  /* HELLO */
    mt_store_bytes nonce;    /* HELLO: MT_STORE_NONCE_LEN bytes */
    uint32_t proto;          /* AUTH */
    mt_store_bytes version, job_id;
    mt_store_bytes mac;      /* AUTH: MT_STORE_MAC_LEN bytes */
    mt_store_bytes signed_part; /* AUTH: the fields mac_c covers (proto .. job id) */
    uint32_t nkeys;          /* WAIT: the keys follow at keys_at, each a length-prefixed string */
    const uint8_t *keys_at;
    size_t keys_len;
} mt_store_request;

/* Parses a request payload, validating every bound (known opcode, key 1..MT_STORE_MAX_KEY bytes,
 * values up to MT_STORE_MAX_VALUE, no trailing bytes). On failure writes why into why. */
bool mt_store_parse_request(const uint8_t *payload, size_t len, mt_store_request *req, char *why,
                            size_t why_cap);

/* Iterates WAIT keys of a parsed request: *pos starts at 0. Returns false after the last key. */
bool mt_store_next_wait_key(const mt_store_request *req, size_t *pos, mt_store_bytes *key);

/* A growable frame being written. The 4-byte length is filled in by mt_store_buf_finish. On
 * allocation failure the buffer is marked failed and further appends are ignored. */
typedef struct mt_store_buf {
    uint8_t *data;
    size_t len, cap;
    bool failed;
} mt_store_buf;

/* Starts a frame whose payload begins with code (an opcode or a reply code). */
void mt_store_buf_begin(mt_store_buf *b, uint8_t code);
void mt_store_buf_u8(mt_store_buf *b, uint8_t v);
void mt_store_buf_u32(mt_store_buf *b, uint32_t v);
void mt_store_buf_u64(mt_store_buf *b, uint64_t v);
void mt_store_buf_bytes(mt_store_buf *b, const void *data, size_t len);
void mt_store_buf_str(mt_store_buf *b, const char *s);
/* Bytes without a length (the caller wrote one). */
void mt_store_buf_raw(mt_store_buf *b, const void *data, size_t len);
/* Writes the length prefix; returns false if an allocation failed along the way. */
bool mt_store_buf_finish(mt_store_buf *b);
void mt_store_buf_free(mt_store_buf *b);

/* A cursor over a received payload; reads past the end set bad instead of reading. */
typedef struct mt_store_reader {
    const uint8_t *p;
    size_t left;
    bool bad;
} mt_store_reader;

uint8_t mt_store_read_u8(mt_store_reader *r);
uint32_t mt_store_read_u32(mt_store_reader *r);
uint64_t mt_store_read_u64(mt_store_reader *r);
/* A length-prefixed byte string of at most max bytes. */
mt_store_bytes mt_store_read_bytes(mt_store_reader *r, size_t max);

uint32_t mt_store_get_be32(const uint8_t *p);
void mt_store_put_be32(uint8_t *p, uint32_t v);

#endif
