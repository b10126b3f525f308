/* Fuzzes the store server's request parser, the code that reads bytes a remote peer chose.
 *
 * Property: parsing never reads out of bounds (ASan), and whatever parses re-encodes to exactly
 * the input bytes with every field within its bound, so nothing malformed is accepted. The
 * handshake is driven too: an AUTH that parses is checked the way the server checks it, and only
 * the unmutated one, whose MAC was made with the token over its own bytes, may pass; a mutated
 * HELLO or AUTH never passes for a good one.
 *
 * With libFuzzer (clang, ASan+UBSan), for as long as you like (docs/fuzzing.md):
 *   scripts/fuzz 600 fuzz_store_frame
 * Without it (ctest), a built-in driver mutates valid requests of every opcode with a fixed seed.
 */
#include "store/auth.h"
#include "store/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void encode(const mt_store_request *r, mt_store_buf *b) {
    mt_store_buf_begin(b, (uint8_t)r->op);
    switch (r->op) {
    case MT_STORE_OP_HELLO:
        mt_store_buf_u32(b, r->magic);
        mt_store_buf_u32(b, r->format);
        mt_store_buf_bytes(b, r->nonce.data, r->nonce.len);
        break;
    case MT_STORE_OP_AUTH:
        mt_store_buf_u32(b, r->proto);
        mt_store_buf_bytes(b, r->version.data, r->version.len);
        mt_store_buf_bytes(b, r->job_id.data, r->job_id.len);
        mt_store_buf_bytes(b, r->mac.data, r->mac.len);
        break;
    case MT_STORE_OP_STATS:
        break;
    case MT_STORE_OP_SET:
        mt_store_buf_bytes(b, r->key.data, r->key.len);
        mt_store_buf_bytes(b, r->value.data, r->value.len);
        break;
    case MT_STORE_OP_GET:
        mt_store_buf_bytes(b, r->key.data, r->key.len);
        mt_store_buf_u64(b, r->timeout_ms);
        break;
    case MT_STORE_OP_TRY_GET:
    case MT_STORE_OP_DELETE:
        mt_store_buf_bytes(b, r->key.data, r->key.len);
        break;
    case MT_STORE_OP_ADD:
        mt_store_buf_bytes(b, r->key.data, r->key.len);
        mt_store_buf_u64(b, (uint64_t)r->delta);
        break;
    case MT_STORE_OP_CAS:
        mt_store_buf_bytes(b, r->key.data, r->key.len);
        mt_store_buf_bytes(b, r->expected.data, r->expected.len);
        mt_store_buf_bytes(b, r->value.data, r->value.len);
        break;
    case MT_STORE_OP_WAIT: {
        mt_store_buf_u8(b, r->any ? 1 : 0);
        mt_store_buf_u64(b, r->timeout_ms);
        mt_store_buf_u32(b, r->nkeys);
        size_t pos = 0;
        mt_store_bytes k;
        while (mt_store_next_wait_key(r, &pos, &k)) mt_store_buf_bytes(b, k.data, k.len);
        break;
    }
    }
    mt_store_buf_finish(b);
}

static void fail(const char *what, const uint8_t *data, size_t size) {
    fprintf(stderr, "fuzz_store_frame: %s (input of %zu bytes, opcode %d)\n", what, size,
            size ? data[0] : -1);
    abort();
}

/* The handshake's fixed inputs: a token and the two nonces of one exchange. */
static const char TOKEN[] = "fuzz-token-0123456789abcdef0123456789abcdef";
static const uint8_t CLIENT_NONCE[MT_STORE_NONCE_LEN] = {1, 2, 3};
static const uint8_t SERVER_NONCE[MT_STORE_NONCE_LEN] = {4, 5, 6};
/* The one AUTH payload that carries a valid MAC (built in auth_seed). */
static uint8_t good_auth[512];
static size_t good_auth_len;

/* The server's check of an AUTH request (store/server.c serve_auth). */
static bool auth_passes(const mt_store_request *r) {
    mt_store_token t;
    uint8_t want[MT_STORE_MAC_LEN];
    if (mt_store_token_resolve(TOKEN, &t) != MT_OK) abort();
    return mt_store_mac(&t, "mtstore-client", CLIENT_NONCE, SERVER_NONCE, r->signed_part.data,
                        r->signed_part.len, want) && mt_store_mac_equal(want, r->mac.data);
}

static void check_one(const uint8_t *data, size_t size) {
    mt_store_request r;
    char why[160];
    if (!mt_store_parse_request(data, size, &r, why, sizeof why)) {
        if (!why[0]) fail("rejected without a reason", data, size);
        return;
    }
    if (r.op == MT_STORE_OP_HELLO &&
        (r.magic != MT_STORE_MAGIC || r.format != MT_STORE_HANDSHAKE_FORMAT ||
         r.nonce.len != MT_STORE_NONCE_LEN))
        fail("accepted a malformed HELLO", data, size);
    if (r.op == MT_STORE_OP_AUTH) {
        if (r.mac.len != MT_STORE_MAC_LEN || r.signed_part.data != data + 1 ||
            r.signed_part.len + 4 + MT_STORE_MAC_LEN + 1 != size)
            fail("AUTH's signed part is not exactly the fields before the MAC", data, size);
        bool good = size == good_auth_len && memcmp(data, good_auth, size) == 0;
        if (auth_passes(&r) != good)
            fail(good ? "the genuine AUTH does not verify" : "a mutated AUTH verifies", data,
                 size);
    }
    bool keyed = r.op != MT_STORE_OP_HELLO && r.op != MT_STORE_OP_WAIT &&
                 r.op != MT_STORE_OP_AUTH && r.op != MT_STORE_OP_STATS;
    if (keyed && (r.key.len == 0 || r.key.len > MT_STORE_MAX_KEY))
        fail("accepted a key out of bounds", data, size);
    if (r.value.len > MT_STORE_MAX_VALUE || r.expected.len > MT_STORE_MAX_VALUE)
        fail("accepted a value out of bounds", data, size);
    if (r.op == MT_STORE_OP_WAIT) {
        size_t pos = 0;
        mt_store_bytes k;
        uint32_t n = 0;
        while (mt_store_next_wait_key(&r, &pos, &k)) {
            if (k.len == 0 || k.len > MT_STORE_MAX_KEY) fail("wait key out of bounds", data, size);
            n++;
        }
        if (n != r.nkeys || n == 0) fail("wait key count differs", data, size);
    }
    mt_store_buf b = {0};
    encode(&r, &b);
    if (b.failed || b.len != size + 4 || memcmp(b.data + 4, data, size) != 0)
        fail("accepted bytes that do not re-encode to themselves", data, size);
    mt_store_buf_free(&b);
}

/* Builds the genuine AUTH (a finished frame in b) and remembers its payload in good_auth. */
static void auth_seed(mt_store_buf *b) {
    mt_store_token t;
    uint8_t mac[MT_STORE_MAC_LEN];
    if (mt_store_token_resolve(TOKEN, &t) != MT_OK) abort();
    mt_store_buf_begin(b, MT_STORE_OP_AUTH);
    mt_store_buf_u32(b, MT_STORE_PROTO_VERSION);
    mt_store_buf_str(b, "0.3.0");
    mt_store_buf_str(b, "job");
    if (!mt_store_mac(&t, "mtstore-client", CLIENT_NONCE, SERVER_NONCE, b->data + 5, b->len - 5,
                      mac))
        abort();
    mt_store_buf_bytes(b, mac, sizeof mac);
    mt_store_buf_finish(b);
    good_auth_len = b->len - 4;
    memcpy(good_auth, b->data + 4, good_auth_len);
}

#ifdef MT_FUZZ_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static mt_store_buf seed;
    if (!good_auth_len) auth_seed(&seed);
    check_one(data, size);
    return 0;
}
#else

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* Valid requests of every opcode, as starting points for mutation. */
static int seeds(mt_store_buf *out) {
    int n = 0;
    mt_store_buf_begin(&out[n], MT_STORE_OP_HELLO);
    mt_store_buf_u32(&out[n], MT_STORE_MAGIC);
    mt_store_buf_u32(&out[n], MT_STORE_HANDSHAKE_FORMAT);
    mt_store_buf_bytes(&out[n++], CLIENT_NONCE, MT_STORE_NONCE_LEN);
    auth_seed(&out[n++]);
    mt_store_buf_begin(&out[n], MT_STORE_OP_STATS);
    n++;
    mt_store_buf_begin(&out[n], MT_STORE_OP_SET);
    mt_store_buf_str(&out[n], "key");
    mt_store_buf_str(&out[n++], "value");
    mt_store_buf_begin(&out[n], MT_STORE_OP_GET);
    mt_store_buf_str(&out[n], "k");
    mt_store_buf_u64(&out[n++], 1000);
    mt_store_buf_begin(&out[n], MT_STORE_OP_TRY_GET);
    mt_store_buf_str(&out[n++], "k");
    mt_store_buf_begin(&out[n], MT_STORE_OP_ADD);
    mt_store_buf_str(&out[n], "ctr");
    mt_store_buf_u64(&out[n++], (uint64_t)-5);
    mt_store_buf_begin(&out[n], MT_STORE_OP_CAS);
    mt_store_buf_str(&out[n], "cas");
    mt_store_buf_str(&out[n], "");
    mt_store_buf_str(&out[n++], "new");
    mt_store_buf_begin(&out[n], MT_STORE_OP_WAIT);
    mt_store_buf_u8(&out[n], 1);
    mt_store_buf_u64(&out[n], 5);
    mt_store_buf_u32(&out[n], 3);
    mt_store_buf_str(&out[n], "a");
    mt_store_buf_str(&out[n], "bb");
    mt_store_buf_str(&out[n++], "ccc");
    mt_store_buf_begin(&out[n], MT_STORE_OP_DELETE);
    mt_store_buf_str(&out[n++], "gone");
    for (int i = 0; i < n; i++) mt_store_buf_finish(&out[i]);
    return n;
}

int main(int argc, char **argv) {
    long iterations = argc > 1 ? atol(argv[1]) : 200000;
    mt_store_buf seed[16] = {{0}};
    int nseeds = seeds(seed);
    uint8_t buf[256];
    int accepted = 0;
    for (int i = 0; i < nseeds; i++) check_one(seed[i].data + 4, seed[i].len - 4);
    for (long it = 0; it < iterations; it++) {
        const mt_store_buf *s = &seed[next() % (uint32_t)nseeds];
        size_t len = s->len - 4;
        memcpy(buf, s->data + 4, len);
        int edits = 1 + (int)(next() % 4);
        for (int e = 0; e < edits; e++) {
            switch (next() % 5) {
            case 0: /* flip a byte */
                if (len) buf[next() % len] ^= (uint8_t)(1u << (next() % 8));
                break;
            case 1: /* random byte */
                if (len) buf[next() % len] = (uint8_t)next();
                break;
            case 2: /* truncate */
                if (len) len = next() % len;
                break;
            case 3: /* append */
                if (len < sizeof buf) buf[len++] = (uint8_t)next();
                break;
            case 4: /* a small or huge number in a length field */
                if (len >= 5) {
                    size_t at = 1 + next() % (len - 4);
                    uint32_t v = next() % 3 == 0 ? next() : next() % 8;
                    mt_store_put_be32(buf + at, v);
                }
                break;
            }
        }
        mt_store_request r;
        char why[160];
        if (mt_store_parse_request(buf, len, &r, why, sizeof why)) accepted++;
        check_one(buf, len);
    }
    for (int i = 0; i < nseeds; i++) mt_store_buf_free(&seed[i]);
    printf("fuzz_store_frame: %ld mutated requests, %d accepted, every check held\n", iterations,
           accepted);
    return accepted > 0 ? 0 : 1; /* no accepted input at all would mean the mutator is broken */
}
#endif
