/* Internal: the rendezvous store's shared secret and the proofs of knowing it (store/auth.c).
 *
 * A job's store token is a secret text of MT_STORE_TOKEN_MIN..MT_STORE_TOKEN_MAX bytes (mtrun
 * makes 64 hex digits from 32 random bytes). It is the HMAC-SHA256 key of the handshake in
 * store/wire.h and never crosses the wire. A store without a token keys the same proofs with the
 * empty key: the protocol is the same, but it then authenticates nothing (docs/security.md). */
#ifndef MT_STORE_AUTH_H
#define MT_STORE_AUTH_H

#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MT_STORE_NONCE_LEN 32
#define MT_STORE_MAC_LEN 32
#define MT_STORE_TOKEN_MIN 32
#define MT_STORE_TOKEN_MAX 1024
/* A token mtrun generates: 32 random bytes as hex, plus the NUL. */
#define MT_STORE_TOKEN_HEX_LEN 65

typedef struct mt_store_token {
    uint8_t key[MT_STORE_TOKEN_MAX];
    size_t len; /* 0: no token */
} mt_store_token;

/* The token to use: given when not NULL ("" means none), else MT_STORE_TOKEN from the
 * environment (unset or empty: none). A token outside the length bounds is an error that names
 * where it came from. */
mt_status mt_store_token_resolve(const char *given, mt_store_token *out);

/* Fills buf with n bytes from the system's CSPRNG (libcrypto's RAND_bytes). */
mt_status mt_store_random(void *buf, size_t n);

/* Writes a fresh token (32 random bytes as 64 lowercase hex digits) into hex. */
mt_status mt_store_token_generate(char hex[MT_STORE_TOKEN_HEX_LEN]);

/* Reads a token file: it must be a regular file that only its owner may read or write (mode
 * 0600 or stricter), else the error names the path and its mode. One trailing newline is
 * dropped. */
mt_status mt_store_token_read_file(const char *path, char *out, size_t cap);

/* HMAC-SHA256 keyed with the token over label (with its NUL) || client nonce || server nonce ||
 * extra. False when libcrypto failed (or memory ran out): the caller must then refuse, never
 * compare. */
bool mt_store_mac(const mt_store_token *t, const char *label, const uint8_t *client_nonce,
                  const uint8_t *server_nonce, const uint8_t *extra, size_t extra_len,
                  uint8_t out[MT_STORE_MAC_LEN]);

/* Constant-time comparison of two MACs (CRYPTO_memcmp). */
bool mt_store_mac_equal(const uint8_t *a, const uint8_t *b);

#endif
