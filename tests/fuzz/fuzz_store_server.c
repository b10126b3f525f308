/* Fuzzes the store server's state machine: the per-connection logic of store/server.c (the
 * token handshake, the pre-authentication limits, the client cap, every request, blocking waits
 * and their deadlines) driven in-process over socketpairs (mt_store_server_test_open / _adopt /
 * _step, store_internal.h), with a clock that moves only when the input says.
 *
 * The input is a sequence of client actions: open or close a connection, half-close it, send a
 * HELLO (valid or not), an AUTH (a good MAC, a bad one, a good MAC with the wrong job or build),
 * a request of any opcode, raw bytes, a truncated frame, an oversized length, or let time pass.
 * After every action the server takes its turns and the harness reads what each connection got.
 *
 * Properties, besides no crash, no leak and no undefined behaviour (ASan+LSan+UBSan):
 *  - a connection that has not authenticated gets nothing but the one challenge after a HELLO,
 *    a REFUSED or BUSY, and then the end of the stream: never a value, a count or an error text;
 *  - a good AUTH is answered with the server's proof (checked with the token), a bad one with
 *    REFUSED, both in the turn the AUTH was sent in; after a refusal the server closes the
 *    connection;
 *  - every reply to a well-formed request of an authenticated client has that opcode's form, in
 *    order, and no reply comes unasked; every value read back (GET, TRY_GET, CAS) is one that some
 *    client wrote to that key (the order across connections is the server's, so only where a
 *    value came from is checked, not which write won);
 *  - memory stays bounded: keys and values within MT_STORE_MAX_BYTES, the server's buffered bytes
 *    within what its connections may make it hold (a stranger: one pre-auth frame and a reply);
 *    connections within the client cap; closed connections are freed.
 *
 * With libFuzzer (clang, ASan+UBSan), for as long as you like (docs/fuzzing.md):
 *   scripts/fuzz 600 fuzz_store_server
 * Without it (ctest), a built-in driver first replays the inputs in tests/fuzz/store_server_inputs
 * (what fuzzing found, one file each), then runs random action sequences with a fixed seed and
 * checks that some of them got as far as authenticating and some were refused.
 */
#include "store/auth.h"
#include "store/store_internal.h"
#include "store/wire.h"

#include <meshtrain/version.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CONNS 6
#define MAX_CLIENTS 4 /* below CONNS, so that the client cap is reached */
#define MAX_ACTIONS 256
#define KEY_MAX 16
#define MAX_WRITES 512

static const char TOKEN[] = "fuzz-server-token-0123456789abcdef0123456789";
static const char JOB[] = "fuzzjob";

typedef struct conn {
    int fd; /* the client's end; -1 when closed by the harness */
    bool used, eof, refused, challenged, authed, wr_shut;
    bool tainted;  /* bytes the harness did not model were sent: only the pre-auth rules hold */
    bool auth_out; /* a good-MAC AUTH is out, its answer not in */
    bool bad_out;  /* a bad AUTH is out after a challenge: REFUSED must come in the same turn */
    int auth_kind; /* what that AUTH should get: 0 OK, 1 BAD_VERSION, 2 BAD_JOB */
    int frames;    /* reply frames received */
    uint8_t client_nonce[MT_STORE_NONCE_LEN], server_nonce[MT_STORE_NONCE_LEN];
    uint8_t mac_c[MT_STORE_MAC_LEN];
    /* The requests whose replies are due, in order: opcode (WAIT "any" with the high bit) and
     * key. */
    struct {
        uint8_t op, klen;
        char key[KEY_MAX];
    } expect[MAX_ACTIONS];
    size_t nexpect, expect_head;
    uint8_t *in; /* reply bytes not yet parsed */
    size_t in_len, in_cap;
} conn;

typedef struct world {
    mt_store_server *server;
    conn c[CONNS];
    unsigned opened;     /* connections ever handed to the server */
    size_t largest_sent; /* the largest frame an authenticated client sent */
    const uint8_t *p;
    size_t left;
    mt_store_token token;
    int authed_ever, refused_ever;
    /* Every value any client may have written, by key; once bytes the harness did not model
     * reached an authenticated connection, values are no longer checked. */
    struct {
        char key[KEY_MAX];
        uint8_t klen;
        const uint8_t *value;
        size_t vlen;
    } writes[MAX_WRITES];
    size_t nwrites;
    bool values_unknown;
} world;

/* A write whose value is any decimal integer: an ADD (its result may be read by another
 * connection in the same turn, before the harness sees the reply that says what it was). */
#define ANY_INTEGER SIZE_MAX

static void fail(const char *what, int ci) {
    fprintf(stderr, "fuzz_store_server: %s (connection %d)\n", what, ci);
    abort();
}

static uint8_t take(world *w) {
    if (!w->left) return 0;
    w->left--;
    return *w->p++;
}

static conn *pick(world *w, int *ci) {
    *ci = take(w) % CONNS;
    conn *c = &w->c[*ci];
    return c->used && c->fd >= 0 ? c : NULL;
}

/* ---- replies ------------------------------------------------------------------------------- */

static void wrote(world *w, const char *key, size_t klen, const void *value, size_t vlen) {
    if (w->nwrites == MAX_WRITES) {
        w->values_unknown = true;
        return;
    }
    memcpy(w->writes[w->nwrites].key, key, klen);
    w->writes[w->nwrites].klen = (uint8_t)klen;
    w->writes[w->nwrites].value = value;
    w->writes[w->nwrites++].vlen = vlen;
}

static bool integer_text(mt_store_bytes v) {
    size_t i = v.len && v.data[0] == '-';
    if (i == v.len || v.len > 20) return false;
    for (; i < v.len; i++)
        if (v.data[i] < '0' || v.data[i] > '9') return false;
    return true;
}

static void check_value(world *w, int ci, const char *key, size_t klen, mt_store_bytes v) {
    if (w->values_unknown) return;
    for (size_t i = 0; i < w->nwrites; i++) {
        if (w->writes[i].klen != klen || memcmp(w->writes[i].key, key, klen) != 0) continue;
        if (w->writes[i].vlen == ANY_INTEGER ? integer_text(v)
                                             : w->writes[i].vlen == v.len &&
                                                   (!v.len || memcmp(w->writes[i].value, v.data,
                                                                     v.len) == 0))
            return;
    }
    fail("a value read back that no client wrote to that key", ci);
}

static void check_form(world *w, int ci, size_t e, uint8_t op, const uint8_t *p, size_t n) {
    conn *c = &w->c[ci];
    const char *key = c->expect[e].key;
    size_t klen = c->expect[e].klen;
    mt_store_reader r = {p + 1, n - 1, false};
    uint8_t code = p[0];
    switch (op) {
    case MT_STORE_OP_SET:
        if (code == MT_STORE_R_ERROR) (void)mt_store_read_bytes(&r, 4096);
        else if (code != MT_STORE_R_OK) fail("SET answered with a code it never gets", ci);
        break;
    case MT_STORE_OP_TRY_GET:
    case MT_STORE_OP_GET:
        if (code == MT_STORE_R_OK) {
            mt_store_bytes v = mt_store_read_bytes(&r, MT_STORE_MAX_VALUE);
            if (!r.bad) check_value(w, ci, key, klen, v);
        } else if (code != (op == MT_STORE_OP_GET ? MT_STORE_R_TIMEOUT : MT_STORE_R_NOT_FOUND)) {
            fail("GET or TRY_GET answered oddly", ci);
        }
        break;
    case MT_STORE_OP_ADD:
        if (code == MT_STORE_R_OK) {
            (void)mt_store_read_u64(&r);
        } else if (code == MT_STORE_R_ERROR) {
            (void)mt_store_read_bytes(&r, 4096);
        } else {
            fail("ADD answered oddly", ci);
        }
        break;
    case MT_STORE_OP_CAS:
        if (code == MT_STORE_R_OK) {
            uint8_t have = mt_store_read_u8(&r);
            mt_store_bytes v = mt_store_read_bytes(&r, MT_STORE_MAX_VALUE);
            if (!r.bad && have) check_value(w, ci, key, klen, v);
            if (!r.bad && !have && v.len) fail("CAS: no value, yet value bytes", ci);
        } else if (code == MT_STORE_R_ERROR) {
            (void)mt_store_read_bytes(&r, 4096);
        } else {
            fail("CAS answered oddly", ci);
        }
        break;
    case MT_STORE_OP_WAIT:
        if (code == MT_STORE_R_OK) {
            (void)mt_store_read_u32(&r);
            /* "any" mode carries the value; the harness remembers the mode as the high bit. */
        } else if (code == MT_STORE_R_TIMEOUT) {
            uint32_t missing = mt_store_read_u32(&r), listed = mt_store_read_u32(&r);
            if (listed > missing || listed > 32) fail("WAIT timeout lists more than missing", ci);
            for (uint32_t i = 0; i < listed && !r.bad; i++)
                (void)mt_store_read_bytes(&r, MT_STORE_MAX_KEY);
        } else {
            fail("WAIT answered oddly", ci);
        }
        break;
    case MT_STORE_OP_WAIT | 0x80:
        if (code == MT_STORE_R_OK) {
            (void)mt_store_read_u32(&r);
            (void)mt_store_read_bytes(&r, MT_STORE_MAX_VALUE);
        } else {
            check_form(w, ci, e, MT_STORE_OP_WAIT, p, n);
            return;
        }
        break;
    case MT_STORE_OP_DELETE:
        if (code != MT_STORE_R_OK) fail("DELETE answered oddly", ci);
        (void)mt_store_read_u8(&r);
        break;
    case MT_STORE_OP_STATS: {
        if (code != MT_STORE_R_OK) fail("STATS answered oddly", ci);
        for (int i = 0; i < 7; i++) (void)mt_store_read_u64(&r);
        for (int i = 0; i < 3; i++) (void)mt_store_read_u32(&r);
        (void)mt_store_read_u64(&r);
        break;
    }
    default:
        fail("harness: unknown expected opcode", ci);
    }
    if (r.bad || r.left) fail("a reply does not have its opcode's form", ci);
}

/* The handshake's answers, and the rule that a stranger learns nothing. */
static void check_preauth(world *w, conn *c, int ci, const uint8_t *p, size_t n) {
    if (c->refused) fail("bytes after a refusal", ci);
    if (n == 1 && (p[0] == MT_STORE_R_REFUSED || (p[0] == MT_STORE_R_BUSY && c->frames == 1))) {
        if (c->auth_out && !c->tainted) fail("a good AUTH was refused", ci);
        c->bad_out = false;
        c->refused = true;
        w->refused_ever++;
        return;
    }
    mt_store_reader r = {p + 1, n - 1, false};
    if (!c->challenged) {
        mt_store_bytes nonce = mt_store_read_bytes(&r, MT_STORE_NONCE_LEN);
        if (p[0] != MT_STORE_R_OK || r.bad || r.left || nonce.len != MT_STORE_NONCE_LEN)
            fail("an unauthenticated client got something other than a challenge", ci);
        memcpy(c->server_nonce, nonce.data, MT_STORE_NONCE_LEN);
        c->challenged = true;
        return;
    }
    if (!c->auth_out) fail("an unauthenticated client got data", ci);
    static const uint8_t want_code[3] = {MT_STORE_R_OK, MT_STORE_R_BAD_VERSION, MT_STORE_R_BAD_JOB};
    if (p[0] != want_code[c->auth_kind]) fail("a good AUTH got the wrong answer", ci);
    mt_store_bytes proof = mt_store_read_bytes(&r, MT_STORE_MAC_LEN);
    uint8_t want[MT_STORE_MAC_LEN];
    if (r.bad || proof.len != MT_STORE_MAC_LEN ||
        !mt_store_mac(&w->token, "mtstore-server", c->client_nonce, c->server_nonce, c->mac_c,
                      MT_STORE_MAC_LEN, want) ||
        !mt_store_mac_equal(want, proof.data))
        fail("the server's proof does not verify", ci);
    c->auth_out = false;
    if (c->auth_kind == 0) {
        if (r.left) fail("trailing bytes after the server's proof", ci);
        c->authed = true;
        w->authed_ever++;
        if (c->tainted) w->values_unknown = true; /* it may have sent writes the harness missed */
    } else {
        c->refused = true; /* told why, and closed */
    }
}

static void on_frame(world *w, conn *c, int ci, const uint8_t *p, size_t n) {
    c->frames++;
    if (n == 0) fail("an empty reply frame", ci);
    if (!c->authed) {
        check_preauth(w, c, ci, p, n);
        return;
    }
    if (c->tainted) return;
    if (c->expect_head == c->nexpect) fail("a reply nobody asked for", ci);
    size_t e = c->expect_head++;
    check_form(w, ci, e, c->expect[e].op, p, n);
}

/* Reads what the server wrote to c and checks every whole frame. */
static void drain(world *w, int ci) {
    conn *c = &w->c[ci];
    if (!c->used || c->fd < 0 || c->eof) return;
    for (;;) {
        if (c->in_cap - c->in_len < 4096) {
            size_t cap = c->in_cap ? c->in_cap * 2 : 8192;
            uint8_t *g = realloc(c->in, cap);
            if (!g) fail("harness out of memory", ci);
            c->in = g;
            c->in_cap = cap;
        }
        ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            c->eof = true;
            break;
        }
        if (n < 0) break;
        c->in_len += (size_t)n;
    }
    size_t off = 0;
    while (c->in_len - off >= 4) {
        uint32_t len = mt_store_get_be32(c->in + off);
        if (c->in_len - off - 4 < len) break;
        on_frame(w, c, ci, c->in + off + 4, len);
        off += 4 + (size_t)len;
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    if (c->eof && c->in_len) fail("the server closed in the middle of a reply", ci);
    if (c->eof && c->auth_out && !c->tainted) fail("a good AUTH was never answered", ci);
}

/* ---- the server's turns and the bounds ------------------------------------------------------ */

static void check_bounds(world *w) {
    mt_store_server_stats st;
    mt_store_server_get_stats(w->server, &st);
    if (st.kv_bytes > st.max_bytes) fail("keys and values over MT_STORE_MAX_BYTES", -1);
    if (st.clients > MAX_CLIENTS || st.clients_peak > MAX_CLIENTS)
        fail("more clients than MT_STORE_MAX_CLIENTS, or a peak above it", -1);
    /* A stranger may hold one pre-auth frame and a short reply (its buffer grows from 64 by
     * doubling); an authenticated client its largest frame and the reply to it. */
    uint64_t bound = (uint64_t)w->opened * (MT_STORE_MAX_PREAUTH_FRAME + 128);
    bound += (uint64_t)w->authed_ever * 4 * (w->largest_sent + 4096);
    if (st.buffered_bytes > bound) fail("the server buffers more than its connections allow", -1);
}

static void turn(world *w, double advance_s) {
    for (int k = 0; k < 3; k++) {
        mt_store_server_test_step(w->server, k == 0 ? advance_s : 0);
        for (int i = 0; i < CONNS; i++) drain(w, i);
    }
    check_bounds(w);
    /* The handshake takes one turn: an AUTH sent on a clean connection is answered in it. */
    for (int i = 0; i < CONNS; i++) {
        const conn *c = &w->c[i];
        if (c->tainted || c->fd < 0) continue;
        if (c->auth_out) fail("a good AUTH was not answered at once", i);
        if (c->bad_out) fail("a bad AUTH was not refused at once", i);
    }
}

/* Sends all of a frame, letting the server read when the socket is full. */
static void send_all(world *w, conn *c, const uint8_t *p, size_t n) {
    int stalls = 0;
    while (n && !c->wr_shut) {
        ssize_t k = send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && ++stalls < 64) {
            turn(w, 0);
            continue;
        }
        c->tainted = true; /* the server closed or stopped reading: the rest is not sent */
        return;
    }
}

static void send_frame(world *w, conn *c, mt_store_buf *b) {
    if (!mt_store_buf_finish(b)) fail("harness out of memory", -1);
    send_all(w, c, b->data, b->len);
    if (c->authed && b->len > w->largest_sent) w->largest_sent = b->len;
    mt_store_buf_free(b);
}

/* ---- actions ------------------------------------------------------------------------------- */

static void act_open(world *w) {
    int ci = take(w) % CONNS;
    conn *c = &w->c[ci];
    if (c->used && c->fd >= 0) return;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) fail("socketpair", ci);
    char peer[32];
    snprintf(peer, sizeof peer, "fuzz#%d", ci);
    if (mt_store_server_test_adopt(w->server, sv[1], peer) != MT_OK) fail("adopt", ci);
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    free(c->in);
    *c = (conn){.fd = sv[0], .used = true};
    for (size_t i = 0; i < MT_STORE_NONCE_LEN; i++) c->client_nonce[i] = take(w);
    w->opened++;
}

static void act_hello(world *w) {
    int ci;
    conn *c = pick(w, &ci);
    uint8_t how = take(w);
    if (!c) return;
    mt_store_buf b = {0};
    mt_store_buf_begin(&b, MT_STORE_OP_HELLO);
    mt_store_buf_u32(&b, how == 1 ? MT_STORE_MAGIC ^ 1 : MT_STORE_MAGIC);
    mt_store_buf_u32(&b, how == 2 ? 1 : MT_STORE_HANDSHAKE_FORMAT);
    mt_store_buf_bytes(&b, c->client_nonce, how == 3 ? MT_STORE_NONCE_LEN - 1 : MT_STORE_NONCE_LEN);
    send_frame(w, c, &b);
}

/* how: 0 good, 1 good MAC but another build, 2 good MAC but another job, 3 a wrong MAC, 4 a MAC
 * over other bytes than those sent. Only a good MAC over a challenge received is "out". */
static void act_auth(world *w) {
    int ci;
    conn *c = pick(w, &ci);
    uint8_t how = take(w) % 5;
    if (!c) return;
    mt_store_buf b = {0};
    mt_store_buf_begin(&b, MT_STORE_OP_AUTH);
    mt_store_buf_u32(&b, MT_STORE_PROTO_VERSION);
    mt_store_buf_str(&b, how == 1 ? "0.0.0-other" : mt_version());
    mt_store_buf_str(&b, how == 2 ? "anotherjob" : JOB);
    size_t signed_len = b.len - 5 - (how == 4 ? 1 : 0);
    if (b.failed || !mt_store_mac(&w->token, "mtstore-client", c->client_nonce, c->server_nonce,
                                  b.data + 5, signed_len, c->mac_c))
        fail("harness: mac", ci);
    if (how == 3) { /* two reads in a fixed order, so an input means the same to every compiler */
        uint8_t bit = (uint8_t)(1u << (take(w) % 8));
        c->mac_c[take(w) % MT_STORE_MAC_LEN] ^= bit;
    }
    mt_store_buf_bytes(&b, c->mac_c, MT_STORE_MAC_LEN);
    bool good = how <= 2 && c->challenged && !c->authed && !c->auth_out && !c->refused &&
                !c->eof && !c->wr_shut;
    bool bad = how > 2 && c->challenged && !c->authed && !c->auth_out && !c->refused &&
               !c->eof && !c->wr_shut;
    /* Set before sending: the server may answer while the harness is still writing. */
    if (good) {
        c->auth_out = true;
        c->auth_kind = how;
    }
    if (bad) c->bad_out = true;
    send_frame(w, c, &b);
}

static mt_store_bytes take_bytes(world *w, size_t max) {
    size_t n = take(w) % (max + 1);
    if (n > w->left) n = w->left;
    mt_store_bytes b = {w->p, n};
    w->p += n;
    w->left -= n;
    return b;
}

/* A key from a small alphabet, mostly of one or two letters, so that requests meet each other's
 * keys; sometimes up to KEY_MAX letters, so that the map grows. */
static size_t put_key(world *w, mt_store_buf *b, char k[KEY_MAX]) {
    uint8_t len = take(w);
    size_t n = len < 192 ? 1 + len % 2 : 1 + len % KEY_MAX;
    for (size_t i = 0; i < n; i++) k[i] = (char)('a' + take(w) % 3);
    mt_store_buf_bytes(b, k, n);
    return n;
}

static void act_request(world *w) {
    int ci;
    conn *c = pick(w, &ci);
    uint8_t op = 2 + take(w) % 9; /* SET .. STATS, AUTH (9) excluded below */
    if (op == MT_STORE_OP_AUTH) op = MT_STORE_OP_STATS;
    if (!c) return;
    mt_store_buf b = {0};
    mt_store_buf_begin(&b, op);
    uint8_t expect = op;
    char key[KEY_MAX], other[KEY_MAX];
    size_t klen = 0;
    mt_store_bytes v;
    switch (op) {
    case MT_STORE_OP_SET:
        klen = put_key(w, &b, key);
        v = take_bytes(w, 255);
        mt_store_buf_bytes(&b, v.data, v.len);
        if (c->authed) wrote(w, key, klen, v.data, v.len);
        break;
    case MT_STORE_OP_GET:
        klen = put_key(w, &b, key);
        mt_store_buf_u64(&b, take(w) * 10u);
        break;
    case MT_STORE_OP_TRY_GET:
    case MT_STORE_OP_DELETE:
        klen = put_key(w, &b, key);
        break;
    case MT_STORE_OP_ADD: {
        klen = put_key(w, &b, key);
        if (c->authed) wrote(w, key, klen, NULL, ANY_INTEGER);
        uint8_t d = take(w);
        mt_store_buf_u64(&b, d & 0x80 ? (uint64_t)INT64_MAX - d : (uint64_t)(int64_t)(d - 64));
        break;
    }
    case MT_STORE_OP_CAS:
        klen = put_key(w, &b, key);
        v = take_bytes(w, 8);
        mt_store_buf_bytes(&b, v.data, v.len);
        v = take_bytes(w, 32);
        mt_store_buf_bytes(&b, v.data, v.len);
        if (c->authed) wrote(w, key, klen, v.data, v.len);
        break;
    case MT_STORE_OP_WAIT: {
        uint8_t any = take(w) & 1, n = 1 + take(w) % 4;
        mt_store_buf_u8(&b, any);
        mt_store_buf_u64(&b, take(w) * 10u);
        mt_store_buf_u32(&b, n);
        for (uint8_t i = 0; i < n; i++) put_key(w, &b, other);
        if (any) expect |= 0x80;
        break;
    }
    default: /* STATS */
        break;
    }
    /* Queued before sending: the server may answer while the harness is still writing. */
    if (c->authed && c->nexpect < MAX_ACTIONS) {
        c->expect[c->nexpect].op = expect;
        c->expect[c->nexpect].klen = (uint8_t)klen;
        memcpy(c->expect[c->nexpect++].key, key, klen);
    }
    send_frame(w, c, &b);
}

static void act_raw(world *w, int kind) {
    int ci;
    conn *c = pick(w, &ci);
    uint8_t head[4];
    mt_store_bytes body = take_bytes(w, 255);
    if (!c) return;
    uint32_t len = (uint32_t)body.len;
    if (kind == 1) len += 1 + take(w); /* truncated: the rest never comes */
    if (kind == 2) /* oversized: over the pre-auth or the absolute limit */
        len = take(w) & 1 ? MT_STORE_MAX_PREAUTH_FRAME + 1 + take(w)
                          : (uint32_t)MT_STORE_MAX_FRAME + 1 + take(w);
    mt_store_put_be32(head, len);
    c->tainted = true;
    if (c->authed) w->values_unknown = true;
    send_all(w, c, head, sizeof head);
    send_all(w, c, body.data, body.len);
}

static void act_close(world *w, bool half) {
    int ci;
    conn *c = pick(w, &ci);
    if (!c) return;
    if (half) {
        if (!c->wr_shut) shutdown(c->fd, SHUT_WR);
        c->wr_shut = true;
        return;
    }
    close(c->fd);
    c->fd = -1;
}

/* Time passing: short steps meet the waits' deadlines, a long one the handshake's. */
static double act_time(world *w) {
    uint8_t t = take(w);
    return t == 255 ? 31.0 : t / 100.0;
}

static void run(const uint8_t *data, size_t size, int *authed, int *refused) {
    world w = {.p = data, .left = size};
    if (mt_store_token_resolve(TOKEN, &w.token) != MT_OK) fail("harness: token", -1);
    mt_store_server_opts o = {.job_id = JOB, .token = TOKEN, .max_clients = MAX_CLIENTS,
                              .max_bytes = 1u << 20};
    if (mt_store_server_test_open(&o, &w.server) != MT_OK) fail(mt_last_error(), -1);
    for (int a = 0; a < MAX_ACTIONS && w.left; a++) {
        double advance = 0;
        switch (take(&w) % 10) {
        case 0: act_open(&w); break;
        case 1: act_close(&w, false); break;
        case 2: act_close(&w, true); break;
        case 3: act_hello(&w); break;
        case 4: act_auth(&w); break;
        case 5: case 6: act_request(&w); break;
        case 7: act_raw(&w, take(&w) % 3); break;
        case 8: advance = act_time(&w); break;
        case 9: break; /* only the server's turn */
        }
        turn(&w, advance);
    }
    /* Everyone leaves: the server must notice and free every connection. */
    for (int i = 0; i < CONNS; i++)
        if (w.c[i].used && w.c[i].fd >= 0) {
            close(w.c[i].fd);
            w.c[i].fd = -1;
        }
    for (int k = 0; k < 3; k++) mt_store_server_test_step(w.server, 0);
    mt_store_server_stats st;
    mt_store_server_get_stats(w.server, &st);
    if (st.clients != 0) fail("connections closed by their clients are still held", -1);
    if (st.buffered_bytes != 0) fail("bytes still buffered with no connection left", -1);
    mt_store_server_stop(w.server);
    for (int i = 0; i < CONNS; i++) free(w.c[i].in);
    *authed += w.authed_ever;
    *refused += w.refused_ever;
}

#ifdef MT_FUZZ_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int authed, refused;
    setenv("MT_LOG_LEVEL", "error", 0); /* every refusal is a warning: expected here */
    run(data, size, &authed, &refused);
    return 0;
}
#else

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint8_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint8_t)(rng >> 24);
}

/* Replays every file of dir as an input; returns how many. */
static int replay(const char *dir, int *authed, int *refused) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "fuzz_store_server: cannot open %s\n", dir);
        exit(1);
    }
    int count = 0;
    struct dirent *e;
    static uint8_t buf[1 << 16];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        fprintf(stderr, "fuzz_store_server: replaying %s (%zu bytes)\n", e->d_name, n);
        run(buf, n, authed, refused);
        count++;
    }
    closedir(d);
    return count;
}

int main(int argc, char **argv) {
    long iterations = argc > 1 ? atol(argv[1]) : 3000;
    setenv("MT_LOG_LEVEL", "error", 0);
    int found_authed = 0, found_refused = 0;
    int found = replay(MT_STORE_SERVER_INPUTS, &found_authed, &found_refused);
    /* A handshake done right, then one request of each kind, then a stranger's request: the
     * path random input takes longest to find. See run() for what each byte means. */
    static const uint8_t script[] = {
        3, 0, 0,                   /* HELLO on connection 0 */
        4, 0, 0,                   /* a good AUTH */
        5, 0, 0, 0, 1, 4, 'v', 'a', 'l', 'u', /* SET "b" = "valu" */
        5, 0, 2, 0, 1,             /* TRY_GET "b" */
        5, 0, 1, 0, 1, 0,          /* GET "b", no wait */
        5, 0, 3, 0, 0, 65,         /* ADD "a" 1 */
        5, 0, 4, 0, 1, 4, 'v', 'a', 'l', 'u', 1, 'w', /* CAS "b" "valu" -> "w" */
        5, 0, 5, 1, 0, 10, 0, 2,   /* WAIT any of "c", 100 ms */
        8, 20,                     /* 200 ms pass: the wait times out */
        5, 0, 6, 0, 1,             /* DELETE "b" */
        5, 0, 8,                   /* STATS */
        0, 1};                     /* open connection 1 (its nonce: the bytes below) */
    uint8_t seed[160] = {0, 0}; /* open connection 0, then its nonce */
    size_t n = 2 + MT_STORE_NONCE_LEN;
    memcpy(seed + n, script, sizeof script);
    n += sizeof script + MT_STORE_NONCE_LEN;
    static const uint8_t stranger[] = {5, 1, 0, 0, 1, 1, 'v'}; /* SET before any handshake */
    memcpy(seed + n, stranger, sizeof stranger);
    n += sizeof stranger;
    int authed = 0, refused = 0;
    run(seed, n, &authed, &refused);
    if (authed != 1 || refused != 1) {
        fprintf(stderr, "fuzz_store_server: the seeded run did not authenticate once and refuse "
                "once (%d, %d)\n", authed, refused);
        return 1;
    }
    uint8_t buf[2048];
    for (long it = 0; it < iterations; it++) {
        size_t len = 64 + next() * 4u;
        for (size_t i = 0; i < len; i++) buf[i] = next();
        /* Half the inputs start from the seed, so that mutations reach past the handshake. */
        if (it & 1) {
            if (len < n) len = n;
            memcpy(buf, seed, n);
            for (int e = 0; e < 4; e++) {
                uint8_t v = next();
                buf[next() % len] = v;
            }
        }
        run(buf, len, &authed, &refused);
    }
    printf("fuzz_store_server: %d inputs replayed, %ld action sequences, %d handshakes passed, "
           "%d refusals, every check held\n", found, iterations + 1, authed, refused);
    return authed > 1 && refused > 0 ? 0 : 1; /* else the driver reaches too little */
}
#endif
