/* The store token and the handshake's proofs. Everything cryptographic comes from libcrypto:
 * the random bytes (RAND_bytes), the MAC (HMAC-SHA256) and the comparison (CRYPTO_memcmp), so
 * that a wrong guess takes as long as a right one. */
#include "store/auth.h"

#include "core/error.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static mt_status token_set(const char *text, const char *from, mt_store_token *out) {
    size_t n = strlen(text);
    out->len = 0;
    if (n == 0) return MT_OK;
    if (n < MT_STORE_TOKEN_MIN || n > MT_STORE_TOKEN_MAX)
        return mt_error(MT_ERR_INVALID_ARG, "%s is %zu bytes long; a store token must be %d..%d "
                        "bytes (for instance `openssl rand -hex 32`)", from, n,
                        MT_STORE_TOKEN_MIN, MT_STORE_TOKEN_MAX);
    memcpy(out->key, text, n);
    out->len = n;
    return MT_OK;
}

mt_status mt_store_token_resolve(const char *given, mt_store_token *out) {
    if (given) return token_set(given, "the store token", out);
    const char *env = getenv("MT_STORE_TOKEN");
    return token_set(env ? env : "", "MT_STORE_TOKEN", out);
}

mt_status mt_store_random(void *buf, size_t n) {
    if (n > (size_t)INT32_MAX || RAND_bytes(buf, (int)n) != 1)
        return mt_error(MT_ERR_SYSTEM, "cannot draw %zu random bytes from libcrypto's RAND_bytes",
                        n);
    return MT_OK;
}

mt_status mt_store_token_generate(char hex[MT_STORE_TOKEN_HEX_LEN]) {
    uint8_t raw[32];
    MT_TRY(mt_store_random(raw, sizeof raw));
    for (size_t i = 0; i < sizeof raw; i++) snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    OPENSSL_cleanse(raw, sizeof raw);
    return MT_OK;
}

mt_status mt_store_token_read_file(const char *path, char *out, size_t cap) {
    /* O_NOFOLLOW: the mode checked is the file's own, not a link's target chosen by others. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return mt_error_errno(MT_ERR_IO, errno, "cannot open the store token file %s", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mt_error_errno(MT_ERR_IO, e, "cannot stat the store token file %s", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mt_error(MT_ERR_INVALID_ARG, "the store token file %s is not a regular file", path);
    }
    if (st.st_mode & 077) {
        close(fd);
        return mt_error(MT_ERR_INVALID_ARG, "the store token file %s has mode %04o: others may "
                        "read it; it must be readable by its owner only (chmod 600 %s)", path,
                        (unsigned)(st.st_mode & 07777), path);
    }
    ssize_t n = read(fd, out, cap - 1);
    int e = errno;
    char extra;
    bool more = n == (ssize_t)cap - 1 && read(fd, &extra, 1) == 1;
    close(fd);
    if (n < 0) return mt_error_errno(MT_ERR_IO, e, "cannot read the store token file %s", path);
    if (more)
        return mt_error(MT_ERR_INVALID_ARG, "the store token file %s is over %zu bytes", path,
                        cap - 1);
    if (n > 0 && out[n - 1] == '\n') n--;
    out[n] = '\0';
    if (strlen(out) != (size_t)n)
        return mt_error(MT_ERR_INVALID_ARG, "the store token file %s holds a NUL byte", path);
    if (n == 0) return mt_error(MT_ERR_INVALID_ARG, "the store token file %s is empty", path);
    return MT_OK;
}

bool mt_store_mac(const mt_store_token *t, const char *label, const uint8_t *client_nonce,
                  const uint8_t *server_nonce, const uint8_t *extra, size_t extra_len,
                  uint8_t out[MT_STORE_MAC_LEN]) {
    /* The label is NUL-terminated on the input so that no label is a prefix of another's. */
    static const uint8_t empty_key[1];
    size_t label_len = strlen(label) + 1;
    unsigned int out_len = 0;
    size_t n = label_len + 2 * MT_STORE_NONCE_LEN + extra_len;
    uint8_t stack[1024];
    uint8_t *msg = n <= sizeof stack ? stack : malloc(n);
    if (!msg) return false;
    memcpy(msg, label, label_len);
    memcpy(msg + label_len, client_nonce, MT_STORE_NONCE_LEN);
    memcpy(msg + label_len + MT_STORE_NONCE_LEN, server_nonce, MT_STORE_NONCE_LEN);
    if (extra_len) memcpy(msg + label_len + 2 * MT_STORE_NONCE_LEN, extra, extra_len);
    bool ok = HMAC(EVP_sha256(), t->len ? t->key : empty_key, (int)t->len, msg, n, out,
                   &out_len) != NULL && out_len == MT_STORE_MAC_LEN;
    if (msg != stack) free(msg);
    return ok;
}

bool mt_store_mac_equal(const uint8_t *a, const uint8_t *b) {
    return CRYPTO_memcmp(a, b, MT_STORE_MAC_LEN) == 0;
}
