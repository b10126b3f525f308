/* The rendezvous store server: one thread, one poll() loop over the listening socket and every
 * client, so that a slow or silent client never blocks the others.
 *
 * Memory per client is bounded: the server reads at most one frame (<= MT_STORE_MAX_FRAME) and
 * stops reading from a client while that frame is being served (a blocking get/wait, or a reply
 * not yet written), so a client that floods requests or never reads replies only fills its own
 * kernel socket buffers. Blocking get/wait are answered by the server when the key appears or the
 * deadline passes; clients never poll. Any malformed input drops that client with a warning.
 * The keys and values themselves live in the map of store/kv.c.
 *
 * Strangers are kept small (docs/security.md): until a client has proven it knows the job's
 * token (the handshake in store/wire.h) its frames are at most MT_STORE_MAX_PREAUTH_FRAME bytes
 * and it may send nothing but the handshake; connections are capped (MT_STORE_MAX_CLIENTS), and
 * so are the bytes of keys and values (MT_STORE_MAX_BYTES). Closing a stranger's connection is
 * logged at most ABUSE_LOG_PER_S times a second, so a flood cannot flood the log too.
 */
#include "store/auth.h"
#include "store/keepalive.h"
#include "store/kv.h"
#include "store/store_internal.h"
#include "store/wire.h"

#include "core/clock.h"
#include "core/env.h"
#include "core/error.h"
#include "core/thread_name.h"

#include <meshtrain/log.h>

#include <openssl/crypto.h>
#include <meshtrain/version.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HANDSHAKE_TIMEOUT_DEFAULT_S 30.0
/* A timed-out wait names at most this many missing keys; the count says how many there were. */
#define WAIT_TIMEOUT_KEYS_LISTED 32
#define ABUSE_LOG_PER_S 5
/* Connections accepted per poll() pass: clients already connected are read between batches, so
 * a job client's HELLO and AUTH are served while a flood waits in the backlog. (Descriptors are
 * bounded by closing an evicted or refused connection at once: max_clients + 1 at most.) */
#define ACCEPTS_PER_PASS 32
/* At the client limit an unauthenticated connection is not evicted for a newcomer (who is told
 * BUSY and retries) before it had this long for its next step: a client of the job sends HELLO
 * as soon as it is connected, and AUTH one round trip after, both far sooner. */
#define EVICT_GRACE_HELLO_S 0.1
#define EVICT_GRACE_AUTH_S 0.5
#define MAX_CLIENTS_DEFAULT 1024
#define MAX_CLIENTS_LIMIT 1000000
#define MAX_BYTES_DEFAULT ((uint64_t)1 << 30)
#define MAX_BYTES_MIN ((uint64_t)1 << 20)
#define MAX_BYTES_LIMIT ((uint64_t)1 << 50)

/* ---- clients and the server ---------------------------------------------------------------- */

typedef enum hs_stage { HS_NEW, HS_CHALLENGED, HS_AUTHED } hs_stage;

struct client;
/* Unauthenticated clients in the order they entered their stage, for O(1) eviction. */
typedef struct client_fifo {
    struct client *head, *tail;
} client_fifo;

typedef struct client {
    struct mt_store_server *server;
    int fd;
    char peer[80];
    hs_stage stage;
    uint8_t client_nonce[MT_STORE_NONCE_LEN], server_nonce[MT_STORE_NONCE_LEN];
    double hello_deadline, accepted_at;
    size_t charged; /* frame + reply buffer bytes counted in the server's buffered total */
    uint8_t head[4];
    size_t head_got;
    uint8_t *frame;
    size_t frame_len, frame_got, frame_cap;
    bool frame_ready; /* a whole frame is held: stop reading until it is served */
    bool pending;     /* a get/wait waiting for keys */
    double deadline;
    mt_store_request req;
    mt_store_buf out;
    size_t out_off;
    bool closing; /* close once the reply is written (a refused handshake) */
    bool dead;    /* closed (fd -1); freed by sweep() */
    client_fifo *fifo; /* the FIFO of its handshake stage, NULL once authenticated or dead */
    struct client *fifo_prev, *fifo_next;
    double stage_since; /* when it entered that FIFO */
} client;

/* Closing strangers' connections: how many were logged in the current one-second window. */
typedef struct abuse_log {
    double window_start;
    unsigned shown, suppressed;
} abuse_log;

struct mt_store_server {
    int listen_fd;
    int wake[2];
    int port;
    char job_id[MT_STORE_MAX_JOB_ID + 1];
    mt_store_token token;
    int max_clients;
    uint64_t max_bytes;
    double handshake_timeout;
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
    atomic_int nclients_public;
    client **clients;
    size_t nclients, cap;
    size_t live;                  /* clients not dead (open descriptors) */
    client_fifo fresh;            /* HS_NEW: no valid HELLO yet */
    client_fifo challenged;       /* HS_CHALLENGED: between HELLO and AUTH */
    double listen_paused_until;
    mt_store_kv kv;
    abuse_log abuse;
    /* Memory and clients, for mt_store_server_stats; written by the server thread only, read
     * under stats_mu by others. */
    pthread_mutex_t stats_mu;
    mt_store_server_stats stats;
    uint64_t buffered;
    struct pollfd *fds; /* the server thread's poll set */
    size_t fds_cap;
    /* Tests (mt_store_server_test_open): no thread, no listener, and a clock that moves only
     * when the test says, so that a fuzzer's runs repeat. */
    bool test_clock;
    double test_now;
};

static double server_now(const mt_store_server *s) {
    return s->test_clock ? s->test_now : mt_clock_now_s();
}

/* Printable form of a key for logs (keys are usually text, but a client chooses them). */
static void printable(mt_store_bytes b, char *out, size_t cap) {
    size_t j = 0;
    for (size_t i = 0; i < b.len && j + 4 < cap; i++) {
        uint8_t c = b.data[i];
        out[j++] = (c >= 32 && c < 127) ? (char)c : '?';
    }
    if (b.len > 0 && j + 4 >= cap) {
        out[j++] = '.';
        out[j++] = '.';
    }
    out[j] = '\0';
}

/* Once the one-second window is over: says how many closings were not logged, and starts a
 * new window. */
static void abuse_window_roll(abuse_log *a, double now) {
    if (now - a->window_start < 1.0) return;
    if (a->suppressed)
        mt_log(MT_LOG_WARN, "store: closed %u more unauthenticated connections in the last "
               "second without logging each", a->suppressed);
    a->window_start = now;
    a->shown = a->suppressed = 0;
}

/* Logs the closing of a stranger's connection, at most ABUSE_LOG_PER_S lines a second; the
 * lines left out are counted in the next one. */
static void log_abuse(mt_store_server *s, const char *peer, const char *why) {
    abuse_log *a = &s->abuse;
    pthread_mutex_lock(&s->stats_mu);
    s->stats.refused++;
    pthread_mutex_unlock(&s->stats_mu);
    abuse_window_roll(a, server_now(s));
    if (a->shown >= ABUSE_LOG_PER_S) {
        a->suppressed++;
        return;
    }
    a->shown++;
    mt_log(MT_LOG_WARN, "store: closing unauthenticated connection from %s: %s", peer, why);
}

static void fifo_remove(client *c) {
    client_fifo *q = c->fifo;
    if (!q) return;
    if (c->fifo_prev) c->fifo_prev->fifo_next = c->fifo_next;
    else q->head = c->fifo_next;
    if (c->fifo_next) c->fifo_next->fifo_prev = c->fifo_prev;
    else q->tail = c->fifo_prev;
    c->fifo = NULL;
    c->fifo_prev = c->fifo_next = NULL;
}

/* Moves c to the tail of q (NULL: out of both FIFOs, once authenticated). */
static void fifo_enter(client *c, client_fifo *q) {
    fifo_remove(c);
    if (!q) return;
    c->fifo = q;
    c->stage_since = server_now(c->server);
    c->fifo_prev = q->tail;
    if (q->tail) q->tail->fifo_next = c;
    else q->head = c;
    q->tail = c;
}

/* Closes the connection at once (its descriptor is free for the next accept); the struct is
 * freed by sweep(). */
static void kill_client(client *c) {
    mt_store_server *s = c->server;
    fifo_remove(c);
    close(c->fd);
    c->fd = -1;
    c->dead = true;
    s->live--;
}

static void drop(client *c, const char *why) {
    if (c->dead) return;
    if (why && c->stage != HS_AUTHED)
        log_abuse(c->server, c->peer, why);
    else if (why)
        mt_log(MT_LOG_WARN, "store: dropping client %s: %s", c->peer, why);
    kill_client(c);
}

/* Keeps the server's count of buffered bytes (frames being read, replies being written) and
 * its peaks up to date after c's buffers changed. */
static void recharge(client *c) {
    mt_store_server *s = c->server;
    size_t now = c->frame_cap + c->out.cap;
    s->buffered = s->buffered - c->charged + now;
    c->charged = now;
    pthread_mutex_lock(&s->stats_mu);
    mt_store_server_stats *st = &s->stats;
    st->buffered_bytes = s->buffered;
    st->kv_bytes = s->kv.bytes;
    if (st->buffered_bytes > st->buffered_peak) st->buffered_peak = st->buffered_bytes;
    if (st->kv_bytes > st->kv_peak) st->kv_peak = st->kv_bytes;
    if (st->buffered_bytes + st->kv_bytes > st->total_peak)
        st->total_peak = st->buffered_bytes + st->kv_bytes;
    pthread_mutex_unlock(&s->stats_mu);
}

static void reset_frame(client *c) {
    c->frame_ready = false;
    c->pending = false;
    c->head_got = 0;
    c->frame_got = c->frame_len = 0;
    /* Frames are sized to their content; an idle client holds no buffer. */
    free(c->frame);
    c->frame = NULL;
    c->frame_cap = 0;
    recharge(c);
}

static void flush(client *c) {
    while (!c->dead && c->out_off < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return;
        } else {
            drop(c, c->frame_ready ? "connection lost while replying" : NULL);
            return;
        }
    }
    if (c->dead) return;
    c->out.len = c->out_off = 0;
    if (c->out.cap > (1u << 20)) mt_store_buf_free(&c->out);
    recharge(c);
    if (c->closing) {
        kill_client(c);
        return;
    }
    reset_frame(c);
}

/* Queues the reply in c->out (built by the caller) and writes what the socket takes now. */
static void send_reply(client *c) {
    if (!mt_store_buf_finish(&c->out)) {
        drop(c, "out of memory building a reply");
        return;
    }
    c->pending = false;
    recharge(c);
    flush(c);
}

static void reply_code(client *c, mt_store_reply code) {
    mt_store_buf_begin(&c->out, (uint8_t)code);
    send_reply(c);
}

static void reply_error(client *c, const char *msg) {
    mt_store_buf_begin(&c->out, MT_STORE_R_ERROR);
    mt_store_buf_str(&c->out, msg);
    send_reply(c);
}

static void reply_value(client *c, mt_store_bytes value) {
    mt_store_buf_begin(&c->out, MT_STORE_R_OK);
    mt_store_buf_bytes(&c->out, value.data, value.len);
    send_reply(c);
}

/* ---- serving requests ---------------------------------------------------------------------- */

/* Answers a pending get/wait if its keys are there; true when answered. */
static bool try_answer(mt_store_server *s, client *c) {
    if (c->req.op == MT_STORE_OP_GET) {
        mt_store_bytes value;
        if (!mt_store_kv_get(&s->kv, c->req.key, &value)) return false;
        reply_value(c, value);
        return true;
    }
    uint32_t index;
    if (!mt_store_kv_wait_done(&s->kv, &c->req, &index)) return false;
    mt_store_buf_begin(&c->out, MT_STORE_R_OK);
    mt_store_buf_u32(&c->out, index);
    if (c->req.any) {
        /* The value saves a second request, which matters when it announces that the store's
         * host is about to go away (an abort). */
        size_t pos = 0;
        mt_store_bytes key = {NULL, 0};
        for (uint32_t i = 0; i <= index; i++) mt_store_next_wait_key(&c->req, &pos, &key);
        mt_store_bytes value = {NULL, 0};
        mt_store_kv_get(&s->kv, key, &value);
        mt_store_buf_bytes(&c->out, value.data, value.len);
    }
    send_reply(c);
    return true;
}

static void wake_waiters(mt_store_server *s) {
    for (size_t i = 0; i < s->nclients; i++) {
        client *c = s->clients[i];
        if (!c->dead && c->pending) try_answer(s, c);
    }
}

static void answer_timeout(mt_store_server *s, client *c) {
    mt_store_buf_begin(&c->out, MT_STORE_R_TIMEOUT);
    if (c->req.op == MT_STORE_OP_WAIT) {
        uint32_t missing = 0, listed = 0;
        size_t pos = 0;
        mt_store_bytes key;
        while (mt_store_next_wait_key(&c->req, &pos, &key))
            if (!mt_store_kv_get(&s->kv, key, NULL)) missing++;
        mt_store_buf_u32(&c->out, missing);
        mt_store_buf_u32(&c->out, missing < WAIT_TIMEOUT_KEYS_LISTED ? missing
                                                                     : WAIT_TIMEOUT_KEYS_LISTED);
        pos = 0;
        while (listed < WAIT_TIMEOUT_KEYS_LISTED && mt_store_next_wait_key(&c->req, &pos, &key)) {
            if (mt_store_kv_get(&s->kv, key, NULL)) continue;
            mt_store_buf_bytes(&c->out, key.data, key.len);
            listed++;
        }
    }
    send_reply(c);
}

/* Whether setting key to a value of len bytes keeps the store under MT_STORE_MAX_BYTES; if not,
 * the client is told so (the connection stays usable). */
static bool fits(mt_store_server *s, client *c, mt_store_bytes key, size_t len) {
    size_t after = mt_store_kv_bytes_after_put(&s->kv, key, len);
    if (after <= s->kv.bytes || after <= s->max_bytes) return true;
    char name[96], msg[320];
    printable(key, name, sizeof name);
    snprintf(msg, sizeof msg, "the store is full: setting '%s' to %zu bytes would hold %zu bytes "
             "of keys and values, over MT_STORE_MAX_BYTES=%" PRIu64, name, len, after,
             s->max_bytes);
    reply_error(c, msg);
    return false;
}

/* Parses a store value as a decimal int64; false when it is not one. */
static bool parse_int(const uint8_t *p, size_t n, int64_t *out) {
    if (n == 0 || n > 20) return false;
    size_t i = 0;
    bool neg = p[0] == '-';
    if (neg) i++;
    if (i == n) return false;
    int64_t v = 0;
    for (; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return false;
        int d = p[i] - '0';
        if (neg ? v < (INT64_MIN + d) / 10 : v > (INT64_MAX - d) / 10) return false;
        v = v * 10 + (neg ? -d : d);
    }
    *out = v;
    return true;
}

static void serve_add(mt_store_server *s, client *c) {
    char name[96];
    mt_store_bytes cur;
    int64_t v = 0;
    if (mt_store_kv_get(&s->kv, c->req.key, &cur) && !parse_int(cur.data, cur.len, &v)) {
        printable(c->req.key, name, sizeof name);
        char msg[160];
        snprintf(msg, sizeof msg, "the value of key '%s' is not an integer", name);
        reply_error(c, msg);
        return;
    }
    int64_t d = c->req.delta;
    if ((d > 0 && v > INT64_MAX - d) || (d < 0 && v < INT64_MIN - d)) {
        reply_error(c, "the addition overflows a 64-bit integer");
        return;
    }
    v += d;
    char text[32];
    int n = snprintf(text, sizeof text, "%" PRId64, v);
    if (!fits(s, c, c->req.key, (size_t)n)) return;
    if (!mt_store_kv_put(&s->kv, c->req.key, text, (size_t)n)) {
        reply_error(c, "the store server is out of memory");
        return;
    }
    mt_store_buf_begin(&c->out, MT_STORE_R_OK);
    mt_store_buf_u64(&c->out, (uint64_t)v);
    send_reply(c);
    wake_waiters(s);
}

static void serve_cas(mt_store_server *s, client *c) {
    mt_store_bytes cur = {NULL, 0};
    bool have = mt_store_kv_get(&s->kv, c->req.key, &cur);
    bool match = have ? (cur.len == c->req.expected.len &&
                         (cur.len == 0 || memcmp(cur.data, c->req.expected.data, cur.len) == 0))
                      : c->req.expected.len == 0;
    if (match) {
        if (!fits(s, c, c->req.key, c->req.value.len)) return;
        if (!mt_store_kv_put(&s->kv, c->req.key, c->req.value.data, c->req.value.len)) {
            reply_error(c, "the store server is out of memory");
            return;
        }
        have = mt_store_kv_get(&s->kv, c->req.key, &cur);
    }
    mt_store_buf_begin(&c->out, MT_STORE_R_OK);
    mt_store_buf_u8(&c->out, have ? 1 : 0);
    mt_store_buf_bytes(&c->out, cur.data, cur.len);
    send_reply(c);
    if (match) wake_waiters(s);
}

/* The one answer a client that failed the handshake gets, whatever went wrong: REFUSED. */
static void refuse(client *c, const char *why) {
    log_abuse(c->server, c->peer, why);
    c->closing = true;
    reply_code(c, MT_STORE_R_REFUSED);
}

static void serve_hello(client *c) {
    if (c->stage != HS_NEW) {
        refuse(c, "a second HELLO");
        return;
    }
    if (mt_store_random(c->server_nonce, sizeof c->server_nonce) != MT_OK) {
        mt_log(MT_LOG_ERROR, "store: %s", mt_last_error());
        drop(c, NULL);
        return;
    }
    memcpy(c->client_nonce, c->req.nonce.data, MT_STORE_NONCE_LEN);
    c->stage = HS_CHALLENGED;
    fifo_enter(c, &c->server->challenged);
    mt_store_buf_begin(&c->out, MT_STORE_R_OK);
    mt_store_buf_bytes(&c->out, c->server_nonce, MT_STORE_NONCE_LEN);
    send_reply(c);
}

/* Checks mac_c before anything else in AUTH is looked at; then answers with mac_s, and with the
 * server's version or job id when they differ (the client has the token: it may know them). */
static void serve_auth(mt_store_server *s, client *c) {
    const mt_store_request *r = &c->req;
    if (c->stage != HS_CHALLENGED) {
        refuse(c, "AUTH without a HELLO first");
        return;
    }
    uint8_t want[MT_STORE_MAC_LEN], proof[MT_STORE_MAC_LEN];
    if (!mt_store_mac(&s->token, "mtstore-client", c->client_nonce, c->server_nonce,
                      r->signed_part.data, r->signed_part.len, want) ||
        !mt_store_mac_equal(want, r->mac.data)) {
        refuse(c, "wrong store token (MT_STORE_TOKEN / --rdzv_conf token_file differ, or a "
               "stranger)");
        return;
    }
    if (!mt_store_mac(&s->token, "mtstore-server", c->client_nonce, c->server_nonce, r->mac.data,
                      MT_STORE_MAC_LEN, proof)) {
        refuse(c, "libcrypto failed to compute the server's proof");
        return;
    }
    const char *mine = mt_version();
    if (r->proto != MT_STORE_PROTO_VERSION || r->version.len != strlen(mine) ||
        memcmp(r->version.data, mine, r->version.len) != 0) {
        char theirs[MT_STORE_MAX_VERSION + 4];
        printable(r->version, theirs, sizeof theirs);
        mt_log(MT_LOG_WARN, "store: refusing client %s: meshtrain %s (protocol %u), this store "
               "runs meshtrain %s (protocol %u)", c->peer, theirs, r->proto, mine,
               MT_STORE_PROTO_VERSION);
        mt_store_buf_begin(&c->out, MT_STORE_R_BAD_VERSION);
        mt_store_buf_bytes(&c->out, proof, sizeof proof);
        mt_store_buf_u32(&c->out, MT_STORE_PROTO_VERSION);
        mt_store_buf_str(&c->out, mine);
        c->closing = true;
        send_reply(c);
        return;
    }
    if (r->job_id.len != strlen(s->job_id) || memcmp(r->job_id.data, s->job_id, r->job_id.len)) {
        char theirs[MT_STORE_MAX_JOB_ID + 4];
        printable(r->job_id, theirs, sizeof theirs);
        mt_log(MT_LOG_WARN, "store: refusing client %s: it is in job '%s', this store belongs to "
               "job '%s'", c->peer, theirs, s->job_id);
        mt_store_buf_begin(&c->out, MT_STORE_R_BAD_JOB);
        mt_store_buf_bytes(&c->out, proof, sizeof proof);
        mt_store_buf_str(&c->out, s->job_id);
        c->closing = true;
        send_reply(c);
        return;
    }
    c->stage = HS_AUTHED;
    fifo_remove(c);
    mt_store_buf_begin(&c->out, MT_STORE_R_OK);
    mt_store_buf_bytes(&c->out, proof, sizeof proof);
    send_reply(c);
}

static void serve_stats(mt_store_server *s, client *c) {
    mt_store_server_stats st;
    mt_store_server_get_stats(s, &st);
    mt_store_buf_begin(&c->out, MT_STORE_R_OK);
    mt_store_buf_u64(&c->out, st.kv_bytes);
    mt_store_buf_u64(&c->out, st.kv_peak);
    mt_store_buf_u64(&c->out, st.buffered_bytes);
    mt_store_buf_u64(&c->out, st.buffered_peak);
    mt_store_buf_u64(&c->out, st.total_peak);
    mt_store_buf_u64(&c->out, st.refused);
    mt_store_buf_u64(&c->out, st.busy);
    mt_store_buf_u32(&c->out, st.clients);
    mt_store_buf_u32(&c->out, st.clients_peak);
    mt_store_buf_u32(&c->out, st.max_clients);
    mt_store_buf_u64(&c->out, st.max_bytes);
    send_reply(c);
}

static void serve(mt_store_server *s, client *c) {
    char why[160];
    bool authed = c->stage == HS_AUTHED;
    if (!mt_store_parse_request(c->frame, c->frame_len, &c->req, why, sizeof why)) {
        char msg[200];
        snprintf(msg, sizeof msg, "invalid request: %s", why);
        /* A stranger gets the same one byte whatever it sent; a client of this job is dropped. */
        if (authed)
            drop(c, msg);
        else
            refuse(c, msg);
        return;
    }
    bool handshake = c->req.op == MT_STORE_OP_HELLO || c->req.op == MT_STORE_OP_AUTH;
    if (!authed && !handshake) {
        refuse(c, "a request before the handshake");
        return;
    }
    if (authed && handshake) {
        drop(c, "a second handshake on one connection");
        return;
    }
    mt_store_bytes value;
    switch (c->req.op) {
    case MT_STORE_OP_HELLO:
        serve_hello(c);
        break;
    case MT_STORE_OP_AUTH:
        serve_auth(s, c);
        break;
    case MT_STORE_OP_STATS:
        serve_stats(s, c);
        break;
    case MT_STORE_OP_SET:
        if (!fits(s, c, c->req.key, c->req.value.len)) break;
        if (!mt_store_kv_put(&s->kv, c->req.key, c->req.value.data, c->req.value.len)) {
            reply_error(c, "the store server is out of memory");
            break;
        }
        reply_code(c, MT_STORE_R_OK);
        wake_waiters(s);
        break;
    case MT_STORE_OP_TRY_GET:
        if (mt_store_kv_get(&s->kv, c->req.key, &value))
            reply_value(c, value);
        else
            reply_code(c, MT_STORE_R_NOT_FOUND);
        break;
    case MT_STORE_OP_GET:
    case MT_STORE_OP_WAIT:
        if (try_answer(s, c)) break;
        if (c->req.timeout_ms == 0) {
            answer_timeout(s, c);
            break;
        }
        c->pending = true;
        c->deadline = server_now(s) + (double)c->req.timeout_ms / 1000.0;
        break;
    case MT_STORE_OP_ADD:
        serve_add(s, c);
        break;
    case MT_STORE_OP_CAS:
        serve_cas(s, c);
        break;
    case MT_STORE_OP_DELETE: {
        bool existed = mt_store_kv_delete(&s->kv, c->req.key);
        mt_store_buf_begin(&c->out, MT_STORE_R_OK);
        mt_store_buf_u8(&c->out, existed ? 1 : 0);
        send_reply(c);
        break;
    }
    }
}

/* Reads what the socket has for the current frame, without reading past it. */
static void read_client(mt_store_server *s, client *c) {
    while (!c->dead && !c->frame_ready) {
        uint8_t *dst;
        size_t want;
        if (c->head_got < 4) {
            dst = c->head + c->head_got;
            want = 4 - c->head_got;
        } else {
            /* Grow the buffer as bytes arrive, so a large length prefix alone costs nothing. */
            if (c->frame_got == c->frame_cap) {
                size_t cap = c->frame_cap ? c->frame_cap * 2 : 4096;
                if (cap > c->frame_len) cap = c->frame_len;
                uint8_t *grown = realloc(c->frame, cap);
                if (!grown) {
                    drop(c, "out of memory reading a frame");
                    return;
                }
                c->frame = grown;
                c->frame_cap = cap;
                recharge(c);
            }
            dst = c->frame + c->frame_got;
            want = c->frame_cap - c->frame_got;
        }
        ssize_t n = recv(c->fd, dst, want, 0);
        if (n == 0) {
            bool mid = c->head_got > 0;
            drop(c, mid ? "disconnected in the middle of a frame" : NULL);
            if (!mid) mt_log(MT_LOG_DEBUG, "store: client %s disconnected", c->peer);
            return;
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            drop(c, c->head_got ? "connection error in the middle of a frame" : NULL);
            return;
        }
        if (c->head_got < 4) {
            c->head_got += (size_t)n;
            if (c->head_got < 4) continue;
            uint32_t len = mt_store_get_be32(c->head);
            if (c->stage != HS_AUTHED && len > MT_STORE_MAX_PREAUTH_FRAME) {
                char msg[160];
                snprintf(msg, sizeof msg, "a frame of %u bytes before authenticating (at most "
                         "%u)", len, MT_STORE_MAX_PREAUTH_FRAME);
                drop(c, msg);
                return;
            }
            if (len == 0 || len > MT_STORE_MAX_FRAME) {
                char msg[160];
                snprintf(msg, sizeof msg, "frame length %u is outside 1..%zu (garbage or an "
                         "oversized request)", len, (size_t)MT_STORE_MAX_FRAME);
                drop(c, msg);
                return;
            }
            c->frame_len = len;
            c->frame_got = 0;
        } else {
            c->frame_got += (size_t)n;
            if (c->frame_got == c->frame_len) {
                c->frame_ready = true;
                serve(s, c);
            }
        }
    }
}

/* The FIFO head if it has been in its stage for grace_s, else NULL. */
static client *evictable(client_fifo *q, double now, double grace_s) {
    return q->head && now - q->head->stage_since >= grace_s ? q->head : NULL;
}

/* At the client limit, room for one more: closes the connection that has waited longest
 * without sending a valid HELLO (if for EVICT_GRACE_HELLO_S), else the one that has waited
 * longest between HELLO and AUTH (if for EVICT_GRACE_AUTH_S); else there is no room (the
 * newcomer is told BUSY and retries). So a client in the middle of its handshake is never
 * evicted while a silent connection can be, nor within EVICT_GRACE_AUTH_S of its HELLO. O(1). */
static bool make_room(mt_store_server *s, double now) {
    if (s->live < (size_t)s->max_clients) return true;
    client *victim = evictable(&s->fresh, now, EVICT_GRACE_HELLO_S);
    if (!victim) victim = evictable(&s->challenged, now, EVICT_GRACE_AUTH_S);
    if (!victim) return false;
    char msg[160];
    snprintf(msg, sizeof msg, "the store is at its limit of %d connections "
             "(MT_STORE_MAX_CLIENTS) and this one had not authenticated", s->max_clients);
    drop(victim, msg);
    return true;
}

/* Tells a connection over the limit so in one byte-sized frame and closes it. */
static void refuse_busy(mt_store_server *s, int fd, const char *peer) {
    static const uint8_t busy[5] = {0, 0, 0, 1, MT_STORE_R_BUSY};
    ssize_t w = send(fd, busy, sizeof busy, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    close(fd);
    pthread_mutex_lock(&s->stats_mu);
    s->stats.busy++;
    pthread_mutex_unlock(&s->stats_mu);
    char msg[160];
    snprintf(msg, sizeof msg, "the store is at its limit of %d connections "
             "(MT_STORE_MAX_CLIENTS), all authenticated or in the middle of their handshake",
             s->max_clients);
    log_abuse(s, peer, msg);
}

/* Takes a connected socket as a new client, or turns it away at the client limit; false (the
 * socket closed) when out of memory. */
static bool add_client(mt_store_server *s, int fd, const char *peer, double now) {
    if (s->nclients == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        client **grown = realloc(s->clients, cap * sizeof *grown);
        if (!grown) {
            close(fd);
            return false;
        }
        s->clients = grown;
        s->cap = cap;
    }
    if (!make_room(s, now)) {
        refuse_busy(s, fd, peer);
        return true;
    }
    client *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return false;
    }
    c->server = s;
    c->fd = fd;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->hello_deadline = now + s->handshake_timeout;
    c->accepted_at = now;
    s->clients[s->nclients++] = c;
    s->live++;
    fifo_enter(c, &s->fresh);
    pthread_mutex_lock(&s->stats_mu);
    uint32_t live = (uint32_t)s->live; /* open descriptors, not the dead awaiting sweep() */
    if (live > s->stats.clients_peak) s->stats.clients_peak = live;
    pthread_mutex_unlock(&s->stats_mu);
    return true;
}

static void accept_clients(mt_store_server *s, double now) {
    for (int accepted = 0; accepted < ACCEPTS_PER_PASS; accepted++) {
        struct sockaddr_storage addr;
        socklen_t alen = sizeof addr;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&addr, &alen,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue; /* counted: bounded */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                mt_log(MT_LOG_WARN, "store: cannot accept a connection: %s; retrying shortly",
                       strerror(errno));
                s->listen_paused_until = now + 0.1;
            }
            return;
        }
        char host[INET6_ADDRSTRLEN] = "?", serv[16] = "?", peer[80];
        getnameinfo((struct sockaddr *)&addr, alen, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV);
        const char *shown = strncmp(host, "::ffff:", 7) == 0 ? host + 7 : host; /* IPv4 */
        snprintf(peer, sizeof peer, "%s:%s", shown, serv);
        /* A client whose host vanished without a reset is dropped (and its waits with it) rather
         * than kept for the kernel's default of hours; a failure only costs that. */
        (void)mt_store_socket_tune(fd);
        if (!add_client(s, fd, peer, now)) return;
    }
}

static void free_client(client *c) {
    if (c->fd >= 0) close(c->fd);
    free(c->frame);
    mt_store_buf_free(&c->out);
    c->frame_cap = 0;
    recharge(c);
    free(c);
}

static void sweep(mt_store_server *s) {
    size_t j = 0;
    for (size_t i = 0; i < s->nclients; i++) {
        if (s->clients[i]->dead)
            free_client(s->clients[i]);
        else
            s->clients[j++] = s->clients[i];
    }
    s->nclients = j;
    atomic_store(&s->nclients_public, (int)j);
    pthread_mutex_lock(&s->stats_mu);
    s->stats.clients = (uint32_t)j;
    pthread_mutex_unlock(&s->stats_mu);
}

/* Drops silent clients, answers expired waits; returns the time until the next deadline. */
static double expire(mt_store_server *s, double now) {
    double next = 1.0;
    if (s->listen_paused_until > now && s->listen_paused_until - now < next)
        next = s->listen_paused_until - now;
    /* The count of unlogged closings is said once its window is over, even if no more come. */
    if (s->abuse.suppressed) abuse_window_roll(&s->abuse, now);
    for (size_t i = 0; i < s->nclients; i++) {
        client *c = s->clients[i];
        if (c->dead) continue;
        if (c->stage != HS_AUTHED) {
            /* Also bounds how long a refused client may take to read its refusal. */
            if (now >= c->hello_deadline) {
                char msg[120];
                snprintf(msg, sizeof msg, "no handshake within %g s", s->handshake_timeout);
                drop(c, c->closing ? NULL : msg);
                continue;
            }
            if (c->hello_deadline - now < next) next = c->hello_deadline - now;
        }
        if (c->pending) {
            if (now >= c->deadline) {
                answer_timeout(s, c);
                continue;
            }
            if (c->deadline - now < next) next = c->deadline - now;
        }
    }
    return next;
}

/* One turn of the server: expire deadlines, poll every socket for at most the time until the
 * next deadline (0: do not wait), serve what is ready. False when poll failed for good. */
static bool server_turn(mt_store_server *s, bool may_wait) {
    double now = server_now(s);
    double wait_s = expire(s, now);
    sweep(s);
    if (s->fds_cap < s->nclients + 2) {
        size_t cap = (s->nclients + 2) * 2;
        struct pollfd *grown = realloc(s->fds, cap * sizeof *grown);
        if (!grown) {
            mt_log(MT_LOG_ERROR, "store: out of memory; retrying");
            struct timespec ts = {0, 100000000};
            nanosleep(&ts, NULL);
            return true;
        }
        s->fds = grown;
        s->fds_cap = cap;
    }
    struct pollfd *fds = s->fds;
    fds[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
    bool listening = s->listen_fd >= 0 && s->listen_paused_until <= now;
    fds[1] = (struct pollfd){.fd = listening ? s->listen_fd : -1, .events = POLLIN};
    for (size_t i = 0; i < s->nclients; i++) {
        client *c = s->clients[i];
        short ev = POLLRDHUP;
        if (!c->frame_ready) ev |= POLLIN;
        if (c->out_off < c->out.len) ev |= POLLOUT;
        fds[i + 2] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    int timeout_ms = may_wait ? (int)ceil(wait_s * 1000.0) : 0;
    if (timeout_ms < 0) timeout_ms = 0;
    int n = poll(fds, s->nclients + 2, timeout_ms);
    if (n < 0) {
        if (errno == EINTR) return true;
        mt_log(MT_LOG_ERROR, "store: poll failed: %s", strerror(errno));
        return false;
    }
    if (fds[0].revents) {
        char buf[64];
        while (read(s->wake[0], buf, sizeof buf) > 0) {
        }
    }
    /* Clients accepted below are not in fds yet; only the first `polled` are. */
    size_t polled = s->nclients;
    for (size_t i = 0; i < polled; i++) {
        client *c = s->clients[i];
        short re = fds[i + 2].revents;
        if (!re || c->dead) continue;
        if (re & POLLOUT) flush(c);
        if (!c->dead && (re & POLLIN)) read_client(s, c);
        if (!c->dead && (re & (POLLERR | POLLHUP | POLLRDHUP)) && c->frame_ready)
            drop(c, c->pending ? NULL : "disconnected before reading its reply");
        if (!c->dead && (re & (POLLERR | POLLHUP | POLLNVAL)) && !(re & POLLIN))
            drop(c, NULL);
    }
    if (listening && (fds[1].revents & POLLIN)) accept_clients(s, server_now(s));
    return true;
}

static void *server_main(void *arg) {
    mt_name_this_thread("mt-store");
    mt_store_server *s = arg;
    while (!atomic_load(&s->stop))
        if (!server_turn(s, true)) break;
    return NULL;
}

/* ---- public API ---------------------------------------------------------------------------- */

/* Binds and listens on one address family; returns the socket or -1 with *err set. */
static int listen_on(const char *bind_addr, const char *serv, int family, int *err) {
    struct addrinfo hints = {.ai_family = family, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res;
    int rc = getaddrinfo(bind_addr, serv, &hints, &res);
    if (rc != 0) {
        *err = rc == EAI_SYSTEM ? errno : EADDRNOTAVAIL;
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            *err = errno;
            continue;
        }
        int one = 1, zero = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        /* "All interfaces" over IPv6 also takes IPv4 clients (mapped addresses). */
        if (ai->ai_family == AF_INET6 && !bind_addr)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0) break;
        *err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static mt_status open_listener(const char *bind_addr, int port, int *out_fd, int *out_port,
                               int *listen_err) {
    bool any = !bind_addr || !*bind_addr;
    char serv[16];
    snprintf(serv, sizeof serv, "%d", port);
    int err = EADDRNOTAVAIL, fd;
    if (any) {
        /* Dual-stack when the host has IPv6, else IPv4 only. */
        fd = listen_on(NULL, serv, AF_INET6, &err);
        if (fd < 0 && err != EADDRINUSE) fd = listen_on(NULL, serv, AF_INET, &err);
    } else {
        fd = listen_on(bind_addr, serv, AF_UNSPEC, &err);
    }
    if (fd < 0) {
        *listen_err = err;
        const char *hint = err == EADDRINUSE ? " (another job's store? choose another "
                                               "MASTER_PORT / --master_port)" : "";
        return mt_error(MT_ERR_IO, "store server: cannot listen on %s:%d: %s%s",
                        any ? "*" : bind_addr, port, strerror(err), hint);
    }
    struct sockaddr_storage sa;
    socklen_t slen = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &slen);
    *out_port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                               : ((struct sockaddr_in *)&sa)->sin_port);
    *out_fd = fd;
    return MT_OK;
}

static mt_status configure(mt_store_server *s, const mt_store_server_opts *o) {
    MT_TRY(mt_store_token_resolve(o->token, &s->token));
    long long clients;
    size_t bytes;
    MT_TRY(mt_env_int("MT_STORE_MAX_CLIENTS", 1, MAX_CLIENTS_LIMIT,
                      o->max_clients > 0 ? o->max_clients : MAX_CLIENTS_DEFAULT,
                      "connections the store accepts at once", &clients));
    MT_TRY(mt_env_bytes("MT_STORE_MAX_BYTES", MAX_BYTES_MIN, MAX_BYTES_LIMIT,
                        o->max_bytes > 0 ? (size_t)o->max_bytes : MAX_BYTES_DEFAULT,
                        "bytes of keys and values the store holds", &bytes));
    s->max_clients = (int)clients;
    s->max_bytes = bytes;
    s->stats.max_clients = (uint32_t)clients;
    s->stats.max_bytes = bytes;
    return MT_OK;
}

mt_status mt_store_server_start(const char *bind_addr, int port, const char *job_id,
                                mt_store_server **out) {
    int listen_err;
    mt_store_server_opts o = {.bind_addr = bind_addr, .port = port, .job_id = job_id};
    return mt_store_server_start_opts(&o, out, &listen_err);
}

/* A configured server without a listener or a thread (st != MT_OK: *out is NULL). */
static mt_status server_new(const mt_store_server_opts *o, mt_store_server **out) {
    *out = NULL;
    const char *job_id = o->job_id ? o->job_id : "";
    if (o->port < 0 || o->port > 65535)
        return mt_error(MT_ERR_INVALID_ARG, "store server: port %d is outside 0..65535", o->port);
    if (strlen(job_id) > MT_STORE_MAX_JOB_ID)
        return mt_error(MT_ERR_INVALID_ARG, "store server: job id is longer than %d bytes",
                        MT_STORE_MAX_JOB_ID);
    mt_store_server *s = calloc(1, sizeof *s);
    if (!s) return mt_error(MT_ERR_OUT_OF_MEMORY, "store server: out of memory");
    s->listen_fd = s->wake[0] = s->wake[1] = -1;
    pthread_mutex_init(&s->stats_mu, NULL);
    snprintf(s->job_id, sizeof s->job_id, "%s", job_id);
    mt_status st = mt_env_seconds("MT_STORE_HANDSHAKE_TIMEOUT_S", 0.001, 1e6,
                                  HANDSHAKE_TIMEOUT_DEFAULT_S,
                                  "how long a new client may take to introduce itself",
                                  &s->handshake_timeout);
    if (st == MT_OK) st = configure(s, o);
    if (st == MT_OK && pipe2(s->wake, O_NONBLOCK | O_CLOEXEC) != 0)
        st = mt_error_errno(MT_ERR_SYSTEM, errno, "cannot create its wake-up pipe");
    if (st != MT_OK) {
        mt_store_server_stop(s);
        return mt_error_wrap(st, "store server");
    }
    *out = s;
    return MT_OK;
}

mt_status mt_store_server_start_opts(const mt_store_server_opts *o, mt_store_server **out,
                                     int *listen_err) {
    *out = NULL;
    *listen_err = 0;
    mt_store_server *s;
    MT_TRY(server_new(o, &s));
    mt_status st = open_listener(o->bind_addr, o->port, &s->listen_fd, &s->port, listen_err);
    if (st != MT_OK) goto fail;
    /* The server thread takes no signals: the host process (mtrun) handles them on its own. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&s->thread, NULL, server_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        st = mt_error_errno(MT_ERR_SYSTEM, rc, "store server: cannot start its thread");
        goto fail;
    }
    s->thread_started = true;
    mt_log(MT_LOG_DEBUG, "store: serving job '%s' on %s:%d (%s, at most %d clients and %" PRIu64
           " bytes of keys and values)", s->job_id, o->bind_addr && *o->bind_addr ? o->bind_addr
           : "*", s->port, s->token.len ? "token required" : "no token", s->max_clients,
           s->max_bytes);
    *out = s;
    return MT_OK;
fail:
    mt_store_server_stop(s);
    return st;
}

void mt_store_server_get_stats(mt_store_server *s, mt_store_server_stats *out) {
    pthread_mutex_lock(&s->stats_mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->stats_mu);
}

int mt_store_default_max_clients(int world, int nnodes) {
    int64_t n = (int64_t)(world > 0 ? world : 1) + 3 * (int64_t)(nnodes > 0 ? nnodes : 1) + 32;
    return n > MAX_CLIENTS_LIMIT ? MAX_CLIENTS_LIMIT : (int)n;
}

int mt_store_server_port(const mt_store_server *server) { return server ? server->port : -1; }

int mt_store_server_clients(mt_store_server *server) {
    return server ? atomic_load(&server->nclients_public) : 0;
}

void mt_store_server_stop(mt_store_server *s) {
    if (!s) return;
    if (s->thread_started) {
        atomic_store(&s->stop, true);
        ssize_t w;
        do {
            w = write(s->wake[1], "x", 1);
        } while (w < 0 && errno == EINTR);
        pthread_join(s->thread, NULL);
    }
    for (size_t i = 0; i < s->nclients; i++) free_client(s->clients[i]);
    free(s->clients);
    free(s->fds);
    if (s->abuse.suppressed)
        mt_log(MT_LOG_WARN, "store: closed %u more unauthenticated connections without logging "
               "each", s->abuse.suppressed);
    if (s->thread_started) {
        mt_store_server_stats st = s->stats;
        mt_log(MT_LOG_DEBUG, "store: stopped; peak %" PRIu64 " bytes of keys and values, %" PRIu64
               " bytes buffered, %" PRIu64 " together (cap %" PRIu64 "), %u clients at once, %"
               PRIu64 " unauthenticated connections closed, %" PRIu64 " turned away at the "
               "client limit", st.kv_peak, st.buffered_peak, st.total_peak, st.max_bytes,
               st.clients_peak, st.refused, st.busy);
    }
    mt_store_kv_free(&s->kv);
    if (s->listen_fd >= 0) close(s->listen_fd);
    if (s->wake[0] >= 0) close(s->wake[0]);
    if (s->wake[1] >= 0) close(s->wake[1]);
    OPENSSL_cleanse(&s->token, sizeof s->token);
    pthread_mutex_destroy(&s->stats_mu);
    free(s);
}

/* ---- driving the server from a test (store_internal.h) ------------------------------------- */

mt_status mt_store_server_test_open(const mt_store_server_opts *opts, mt_store_server **out) {
    MT_TRY(server_new(opts, out));
    (*out)->test_clock = true;
    (*out)->test_now = 1000.0;
    return MT_OK;
}

mt_status mt_store_server_test_adopt(mt_store_server *s, int fd, const char *peer) {
    if (!s->test_clock || fd < 0)
        return mt_error(MT_ERR_INVALID_ARG, "store server: test_adopt needs a server from "
                        "mt_store_server_test_open and a connected socket (fd %d)", fd);
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        int err = errno;
        close(fd);
        return mt_error_errno(MT_ERR_SYSTEM, err, "store server: cannot make socket %d of %s "
                              "non-blocking", fd, peer);
    }
    if (!add_client(s, fd, peer, s->test_now))
        return mt_error(MT_ERR_OUT_OF_MEMORY, "store server: out of memory adopting %s", peer);
    return MT_OK;
}

void mt_store_server_test_step(mt_store_server *s, double advance_s) {
    if (!s->test_clock) return;
    if (advance_s > 0) s->test_now += advance_s;
    server_turn(s, false);
}
