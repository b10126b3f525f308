/* The rendezvous store client: one TCP connection, requests serialized by a mutex, every wait
 * bounded by a deadline. Blocking get/wait are waited for by the server; the client only waits
 * for the reply, a little longer than the server's deadline so that a dead server is noticed. */
#include "store/auth.h"
#include "store/keepalive.h"
#include "store/store_internal.h"
#include "store/wire.h"

#include "core/clock.h"
#include "core/env.h"
#include "core/error.h"

#include <meshtrain/log.h>
#include <meshtrain/version.h>

#include <openssl/crypto.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_S 300.0
/* How much longer than the server's own deadline a client waits for a get/wait reply. */
#define REPLY_GRACE_S 10.0
#define MAX_TIMEOUT_S 1e8
#define MIN_TIMEOUT_S 0.001

struct mt_store {
    int fd;
    bool broken;
    char addr[300]; /* "host:port" for messages */
    char prefix[MT_STORE_MAX_PREFIX + 1]; /* put before every key on the wire (rounds of a job) */
    size_t prefix_len;                    /* strlen(prefix); both under mu */
    double answer_limit; /* > 0: the longest wait for an answer beyond the server's own (mu) */
    pthread_mutex_t mu;
    mt_store_buf req;
};

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

mt_status mt_timeout_from_env(double *out) {
    return mt_env_seconds("MT_TIMEOUT_S", MIN_TIMEOUT_S, MAX_TIMEOUT_S, DEFAULT_TIMEOUT_S,
                          "how long the job's processes wait for each other", out);
}

double mt_default_timeout(void) {
    static atomic_bool warned;
    double v;
    if (mt_timeout_from_env(&v) != MT_OK) {
        /* mt_init and mtrun refuse such a value; a bare store client keeps the default. */
        if (!atomic_exchange(&warned, true))
            mt_log(MT_LOG_WARN, "%s; using %g", mt_last_error(), DEFAULT_TIMEOUT_S);
        return DEFAULT_TIMEOUT_S;
    }
    return v;
}

static double resolve_timeout(double timeout_s) {
    if (timeout_s < 0 || isnan(timeout_s)) return mt_default_timeout();
    return timeout_s > MAX_TIMEOUT_S ? MAX_TIMEOUT_S : timeout_s;
}

static int remaining_ms(double deadline) {
    double left = deadline - mt_clock_now_s();
    if (left <= 0) return 0;
    return left > 1e6 ? 1000000000 : (int)ceil(left * 1000.0);
}

/* ---- socket I/O with deadlines ------------------------------------------------------------- */

typedef enum io_result { IO_OK, IO_TIMEOUT, IO_CLOSED, IO_ERROR } io_result;

static io_result wait_fd(int fd, short events, double deadline, int *err) {
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, remaining_ms(deadline));
        if (n > 0) return IO_OK;
        if (n == 0) return IO_TIMEOUT;
        if (errno != EINTR) {
            *err = errno;
            return IO_ERROR;
        }
    }
}

static io_result send_all(int fd, const uint8_t *p, size_t len, double deadline, int *err) {
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            io_result r = wait_fd(fd, POLLOUT, deadline, err);
            if (r != IO_OK) return r;
            continue;
        }
        *err = errno;
        return (errno == EPIPE || errno == ECONNRESET) ? IO_CLOSED : IO_ERROR;
    }
    return IO_OK;
}

static io_result recv_all(int fd, uint8_t *p, size_t len, double deadline, int *err) {
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) return IO_CLOSED;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            io_result r = wait_fd(fd, POLLIN, deadline, err);
            if (r != IO_OK) return r;
            continue;
        }
        *err = errno;
        return errno == ECONNRESET ? IO_CLOSED : IO_ERROR;
    }
    return IO_OK;
}

/* Reads one reply frame into a malloc'd payload (NUL-terminated one past the end). */
static io_result read_frame(int fd, double deadline, uint8_t **payload, size_t *len, int *err) {
    uint8_t head[4];
    io_result r = recv_all(fd, head, 4, deadline, err);
    if (r != IO_OK) return r;
    uint32_t n = mt_store_get_be32(head);
    if (n == 0 || n > MT_STORE_MAX_FRAME) {
        *err = EPROTO;
        return IO_ERROR;
    }
    uint8_t *buf = malloc((size_t)n + 1);
    if (!buf) {
        *err = ENOMEM;
        return IO_ERROR;
    }
    r = recv_all(fd, buf, n, deadline, err);
    if (r != IO_OK) {
        free(buf);
        return r;
    }
    buf[n] = 0;
    *payload = buf;
    *len = n;
    return IO_OK;
}

/* ---- connecting ---------------------------------------------------------------------------- */

/* One connection attempt to every address of host; returns the socket or -1 with why. */
static int try_connect(const char *host, int port, double deadline, char *why, size_t why_cap) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    char serv[16];
    snprintf(serv, sizeof serv, "%d", port);
    struct addrinfo *res;
    int rc = getaddrinfo(host, serv, &hints, &res);
    if (rc != 0) {
        snprintf(why, why_cap, "cannot resolve '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, naddr = 0, tried = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) naddr++;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next, tried++) {
        /* Each address gets its share of the time left, the last one all of it: an address that
         * drops packets (a stale AAAA record, a firewalled interface) must not eat the deadline
         * of those after it. */
        double now = mt_clock_now_s(), left = deadline - now;
        double addr_deadline = left > 0 ? now + left / (naddr - tried) : deadline;
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            snprintf(why, why_cap, "socket: %s", strerror(errno));
            continue;
        }
        int err = 0;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            err = errno;
            if (err == EINPROGRESS) {
                io_result r = wait_fd(fd, POLLOUT, addr_deadline, &err);
                socklen_t elen = sizeof err;
                if (r == IO_OK) {
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
                } else if (r == IO_TIMEOUT) {
                    err = ETIMEDOUT;
                }
            }
        }
        if (err != 0) {
            snprintf(why, why_cap, "%s", strerror(err));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int e = mt_store_keepalive_apply(fd, mt_default_timeout());
        if (e)
            mt_log(MT_LOG_WARN, "store client: cannot set TCP keepalive on the connection to %s: "
                   "%s; a host that vanishes without a reset is noticed only by the reply "
                   "timeouts", host, strerror(e));
    }
    return fd;
}

/* One request-reply exchange of the handshake; a failure may be retried (*retry). */
static mt_status hs_exchange(int fd, const char *addr, mt_store_buf *b, double deadline,
                             uint8_t **reply, size_t *len, bool *retry) {
    if (!mt_store_buf_finish(b))
        return mt_error(MT_ERR_OUT_OF_MEMORY, "store at %s: out of memory", addr);
    int err = 0;
    io_result r = send_all(fd, b->data, b->len, deadline, &err);
    if (r == IO_OK) r = read_frame(fd, deadline, reply, len, &err);
    if (r == IO_OK) return MT_OK;
    *retry = true;
    return mt_error(r == IO_TIMEOUT ? MT_ERR_TIMEOUT : MT_ERR_PEER_LOST,
                    "the store at %s did not complete the handshake: %s", addr,
                    r == IO_TIMEOUT ? "no answer" : r == IO_CLOSED ? "connection closed"
                                                                   : strerror(err));
}

/* Answers every handshake reply may be that are not the expected one. */
static mt_status hs_unexpected(const char *addr, uint8_t code, const mt_store_token *token) {
    if (code == MT_STORE_R_REFUSED)
        return mt_error(MT_ERR_MISMATCH, "the store at %s refused the handshake: this process %s; "
                        "every node of a job needs the same token (MT_STORE_TOKEN or --rdzv_conf "
                        "token_file; the store's log says more)", addr,
                        token->len ? "has a store token the store does not accept"
                                   : "has no store token (MT_STORE_TOKEN) and the store wants one");
    return mt_error(MT_ERR_PROTOCOL, "the store at %s answered the handshake with unknown code "
                    "%u (is it a meshtrain store of this version?)", addr, code);
}

/* Reads mac_s from an AUTH reply and checks it: a server that cannot prove it knows the token is
 * not believed, whatever it says. */
static mt_status hs_check_server(const char *addr, mt_store_reader *rd, const mt_store_token *t,
                                 const uint8_t *cn, const uint8_t *sn, const uint8_t *mac_c) {
    mt_store_bytes proof = mt_store_read_bytes(rd, MT_STORE_MAC_LEN);
    uint8_t want[MT_STORE_MAC_LEN];
    if (rd->bad || proof.len != MT_STORE_MAC_LEN ||
        !mt_store_mac(t, "mtstore-server", cn, sn, mac_c, MT_STORE_MAC_LEN, want) ||
        !mt_store_mac_equal(want, proof.data))
        return mt_error(MT_ERR_MISMATCH, "the store at %s did not prove that it knows this job's "
                        "store token: not this job's store, or a stranger on its port", addr);
    return MT_OK;
}

mt_status mt_store_client_handshake(int fd, const char *addr, const char *job_id,
                                    const char *version, const char *token_text, double deadline,
                                    bool *retry) {
    *retry = false;
    mt_store_token token;
    MT_TRY(mt_store_token_resolve(token_text, &token));
    uint8_t cn[MT_STORE_NONCE_LEN], sn[MT_STORE_NONCE_LEN], mac_c[MT_STORE_MAC_LEN];
    mt_status st = mt_store_random(cn, sizeof cn);
    mt_store_buf b = {0};
    uint8_t *reply = NULL;
    size_t len = 0;
    if (st != MT_OK) goto out;
    mt_store_buf_begin(&b, MT_STORE_OP_HELLO);
    mt_store_buf_u32(&b, MT_STORE_MAGIC);
    mt_store_buf_u32(&b, MT_STORE_HANDSHAKE_FORMAT);
    mt_store_buf_bytes(&b, cn, sizeof cn);
    st = hs_exchange(fd, addr, &b, deadline, &reply, &len, retry);
    if (st != MT_OK) goto out;
    mt_store_reader rd = {reply + 1, len - 1, false};
    if (reply[0] != MT_STORE_R_OK) {
        st = reply[0] == MT_STORE_R_BUSY ? MT_ERR_PEER_LOST : hs_unexpected(addr, reply[0], &token);
        if (st == MT_ERR_PEER_LOST) {
            *retry = true;
            st = mt_error(st, "the store at %s is at its client limit (MT_STORE_MAX_CLIENTS)",
                          addr);
        }
        goto out;
    }
    mt_store_bytes nonce = mt_store_read_bytes(&rd, MT_STORE_NONCE_LEN);
    if (rd.bad || nonce.len != MT_STORE_NONCE_LEN) {
        st = mt_error(MT_ERR_PROTOCOL, "the store at %s sent a malformed challenge", addr);
        goto out;
    }
    memcpy(sn, nonce.data, sizeof sn);
    free(reply);
    reply = NULL;

    /* AUTH: the MAC covers the fields exactly as they are sent. */
    mt_store_buf_begin(&b, MT_STORE_OP_AUTH);
    size_t signed_from = b.len;
    mt_store_buf_u32(&b, MT_STORE_PROTO_VERSION);
    mt_store_buf_str(&b, version);
    mt_store_buf_str(&b, job_id);
    if (b.failed || !mt_store_mac(&token, "mtstore-client", cn, sn, b.data + signed_from,
                                  b.len - signed_from, mac_c)) {
        st = mt_error(MT_ERR_SYSTEM, "store at %s: cannot compute the handshake's proof "
                      "(libcrypto or memory)", addr);
        goto out;
    }
    mt_store_buf_bytes(&b, mac_c, sizeof mac_c);
    st = hs_exchange(fd, addr, &b, deadline, &reply, &len, retry);
    if (st != MT_OK) goto out;
    rd = (mt_store_reader){reply + 1, len - 1, false};
    uint8_t code = reply[0];
    if (code != MT_STORE_R_OK && code != MT_STORE_R_BAD_JOB && code != MT_STORE_R_BAD_VERSION) {
        st = hs_unexpected(addr, code, &token);
        goto out;
    }
    st = hs_check_server(addr, &rd, &token, cn, sn, mac_c);
    if (st != MT_OK || code == MT_STORE_R_OK) goto out;
    if (code == MT_STORE_R_BAD_JOB) {
        mt_store_bytes s = mt_store_read_bytes(&rd, MT_STORE_MAX_JOB_ID);
        st = mt_error(MT_ERR_MISMATCH, "store at %s belongs to job '%.*s', this process is in job "
                      "'%s'", addr, rd.bad ? 1 : (int)s.len, rd.bad ? "?" : (const char *)s.data,
                      job_id);
        goto out;
    }
    uint32_t proto = mt_store_read_u32(&rd);
    mt_store_bytes s = mt_store_read_bytes(&rd, MT_STORE_MAX_VERSION);
    char theirs[MT_STORE_MAX_VERSION + 1] = "?";
    if (!rd.bad) snprintf(theirs, sizeof theirs, "%.*s", (int)s.len, (const char *)s.data);
    if (strcmp(theirs, version) != 0 || rd.bad)
        st = mt_error(MT_ERR_MISMATCH, "meshtrain version mismatch: server %s, client %s: "
                      "mixed builds are not supported (store at %s)", theirs, version, addr);
    else
        st = mt_error(MT_ERR_MISMATCH, "store protocol mismatch: server protocol %u, client "
                      "protocol %u: mixed builds are not supported (store at %s)", proto,
                      MT_STORE_PROTO_VERSION, addr);
out:
    mt_store_buf_free(&b);
    free(reply);
    OPENSSL_cleanse(&token, sizeof token);
    return st;
}

mt_status mt_store_connect_version(const char *host, int port, const char *job_id,
                                   const char *version, double timeout_s, mt_store **out) {
    return mt_store_connect_token(host, port, job_id, version, NULL, timeout_s, out);
}

mt_status mt_store_connect_token(const char *host, int port, const char *job_id,
                                 const char *version, const char *token, double timeout_s,
                                 mt_store **out) {
    *out = NULL;
    if (!host || !*host) host = "127.0.0.1";
    if (!job_id) job_id = "";
    if (port <= 0 || port > 65535)
        return mt_error(MT_ERR_INVALID_ARG, "store: port %d is outside 1..65535", port);
    if (strlen(job_id) > MT_STORE_MAX_JOB_ID)
        return mt_error(MT_ERR_INVALID_ARG, "store: job id is longer than %d bytes",
                        MT_STORE_MAX_JOB_ID);
    if (strlen(version) > MT_STORE_MAX_VERSION)
        return mt_error(MT_ERR_INVALID_ARG, "store: version string too long");
    mt_store_token checked; /* a malformed token fails now, not after the connect deadline */
    MT_TRY(mt_store_token_resolve(token, &checked));
    OPENSSL_cleanse(&checked, sizeof checked);
    mt_store *st = calloc(1, sizeof *st);
    if (!st) return mt_error(MT_ERR_OUT_OF_MEMORY, "store: out of memory");
    snprintf(st->addr, sizeof st->addr, "%s:%d", host, port);
    timeout_s = resolve_timeout(timeout_s);
    double start = mt_clock_now_s(), deadline = start + timeout_s, delay = 0.02;
    char why[256] = "no attempt made";
    for (;;) {
        int fd = try_connect(host, port, deadline, why, sizeof why);
        if (fd >= 0) {
            bool retry;
            /* A live server answers the handshake at once; a few seconds even past a short
             * connect timeout, so that a loaded machine does not turn into a refusal. */
            double hs_deadline = fmax(deadline, mt_clock_now_s() + 5.0);
            mt_status s = mt_store_client_handshake(fd, st->addr, job_id, version, token,
                                                    hs_deadline, &retry);
            if (s == MT_OK) {
                st->fd = fd;
                pthread_mutex_init(&st->mu, NULL);
                *out = st;
                return MT_OK;
            }
            close(fd);
            if (!retry) {
                free(st);
                return s;
            }
            snprintf(why, sizeof why, "%s", mt_last_error());
        }
        if (mt_clock_now_s() >= deadline) break;
        sleep_s(fmin(delay, deadline - mt_clock_now_s()));
        delay = fmin(delay * 2, 0.5);
    }
    mt_status s = mt_error(MT_ERR_TIMEOUT, "could not connect to the store at %s within %g s: %s "
                           "(is the store host -- node 0's mtrun or rank 0 -- running, and are "
                           "MASTER_ADDR/MASTER_PORT right?)", st->addr, timeout_s, why);
    free(st);
    return s;
}

mt_status mt_store_connect(const char *host, int port, const char *job_id, double timeout_s,
                           mt_store **out) {
    return mt_store_connect_version(host, port, job_id, mt_version(), timeout_s, out);
}

void mt_store_close(mt_store *store) {
    if (!store) return;
    close(store->fd);
    pthread_mutex_destroy(&store->mu);
    mt_store_buf_free(&store->req);
    free(store);
}

const char *mt_store_address(const mt_store *store) { return store ? store->addr : "?"; }

/* ---- requests ------------------------------------------------------------------------------ */

/* Writes prefix + key as one wire string. Caller holds mu. */
static void put_key(mt_store *s, const char *key) {
    size_t p = s->prefix_len, k = strlen(key);
    mt_store_buf_u32(&s->req, (uint32_t)(p + k));
    mt_store_buf_raw(&s->req, s->prefix, p);
    mt_store_buf_raw(&s->req, key, k);
}

mt_status mt_store_set_prefix(mt_store *s, const char *prefix) {
    if (!prefix) prefix = "";
    size_t n = strlen(prefix);
    if (n > MT_STORE_MAX_PREFIX)
        return mt_error(MT_ERR_INVALID_ARG, "store at %s: key prefix '%.48s' is %zu bytes, over "
                        "the limit of %d", s->addr, prefix, n, MT_STORE_MAX_PREFIX);
    pthread_mutex_lock(&s->mu);
    memcpy(s->prefix, prefix, n + 1);
    s->prefix_len = n;
    pthread_mutex_unlock(&s->mu);
    return MT_OK;
}

static size_t prefix_len(mt_store *s) {
    pthread_mutex_lock(&s->mu);
    size_t n = s->prefix_len;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static mt_status check_key(mt_store *s, const char *op, const char *key) {
    if (!key || !*key)
        return mt_error(MT_ERR_INVALID_ARG, "store at %s: %s with an empty key", s->addr, op);
    size_t n = prefix_len(s) + strlen(key);
    if (n > MT_STORE_MAX_KEY)
        return mt_error(MT_ERR_INVALID_ARG, "store at %s: %s: key '%.48s...' is %zu bytes, over "
                        "the limit of %d bytes (MT_STORE_MAX_KEY)", s->addr, op, key, n,
                        MT_STORE_MAX_KEY);
    return MT_OK;
}

static mt_status check_value(const mt_store *s, const char *op, const char *key, size_t len) {
    if (len > MT_STORE_MAX_VALUE)
        return mt_error(MT_ERR_INVALID_ARG, "store at %s: %s '%s': the value is %zu bytes, over "
                        "the limit of %u bytes (MT_STORE_MAX_VALUE)", s->addr, op, key, len,
                        MT_STORE_MAX_VALUE);
    return MT_OK;
}

/* How long a request the server answers at once may wait for its answer: MT_TIMEOUT_S, or the
 * connection's answer limit when shorter. Caller holds mu. */
static double quick_wait(const mt_store *s) {
    double t = mt_default_timeout();
    return s->answer_limit > 0 && s->answer_limit < t ? s->answer_limit : t;
}

/* A blocking get/wait: the server answers at its deadline (server_s); the client waits a little
 * longer, never more than MT_TIMEOUT_S or the answer limit beyond it. Caller holds mu. */
static double blocking_wait(const mt_store *s, double server_s) {
    return server_s + fmin(REPLY_GRACE_S, quick_wait(s));
}

mt_status mt_store_set_answer_limit(mt_store *s, double seconds) {
    if (!(seconds >= 0) || !isfinite(seconds))
        return mt_error(MT_ERR_INVALID_ARG, "store at %s: answer limit %g is not a number of "
                        "seconds", s->addr, seconds);
    pthread_mutex_lock(&s->mu);
    s->answer_limit = seconds;
    pthread_mutex_unlock(&s->mu);
    return MT_OK;
}

/* Sends s->req (finished by the caller) and reads the reply; the caller holds s->mu. A failure
 * here leaves the stream out of step, so the connection is marked broken. */
static mt_status roundtrip(mt_store *s, const char *op, const char *key, double reply_wait_s,
                           uint8_t **reply, size_t *len) {
    if (s->broken)
        return mt_error(MT_ERR_PEER_LOST, "%s '%s': the connection to the store at %s was lost "
                        "earlier", op, key, s->addr);
    if (!mt_store_buf_finish(&s->req))
        return mt_error(MT_ERR_OUT_OF_MEMORY, "%s '%s' on the store at %s: out of memory", op,
                        key, s->addr);
    double deadline = mt_clock_now_s() + reply_wait_s;
    int err = 0;
    io_result r = send_all(s->fd, s->req.data, s->req.len, deadline, &err);
    if (r == IO_OK) r = read_frame(s->fd, deadline, reply, len, &err);
    if (s->req.cap > (1u << 20)) mt_store_buf_free(&s->req);
    if (r == IO_OK) return MT_OK;
    s->broken = true;
    switch (r) {
    case IO_TIMEOUT:
        return mt_error(MT_ERR_TIMEOUT, "%s '%s': the store at %s did not answer within %g s", op,
                        key, s->addr, reply_wait_s);
    case IO_CLOSED:
        return mt_error(MT_ERR_PEER_LOST, "%s '%s': lost the connection to the store at %s (its "
                        "host -- node 0's mtrun or rank 0 -- exited or closed it)", op, key,
                        s->addr);
    default:
        if (err == ETIMEDOUT)
            /* TCP_USER_TIMEOUT or keepalive (store/keepalive.c): nothing came back at all */
            return mt_error(MT_ERR_PEER_LOST, "%s '%s': lost the connection to the store at %s: "
                            "its host stopped acknowledging (down, or the link is cut)", op, key,
                            s->addr);
        return mt_error(MT_ERR_PEER_LOST, "%s '%s': lost the connection to the store at %s: %s",
                        op, key, s->addr, strerror(err));
    }
}

/* Turns reply codes every operation may get into an error. */
static mt_status unexpected(mt_store *s, const char *op, const char *key, const uint8_t *reply,
                            size_t len) {
    if (reply[0] == MT_STORE_R_ERROR) {
        mt_store_reader rd = {reply + 1, len - 1, false};
        mt_store_bytes m = mt_store_read_bytes(&rd, len);
        return mt_error(MT_ERR_INVALID_ARG, "%s '%s' on the store at %s failed: %.*s", op, key,
                        s->addr, rd.bad ? 0 : (int)m.len, rd.bad ? "" : (const char *)m.data);
    }
    s->broken = true;
    return mt_error(MT_ERR_PROTOCOL, "%s '%s': the store at %s sent an unexpected reply (code %u, "
                    "%zu bytes)", op, key, s->addr, reply[0], len);
}

/* Copies a length-prefixed value out of a reply into a malloc'd NUL-terminated buffer. */
static mt_status take_value(mt_store *s, const char *op, const char *key, mt_store_reader *rd,
                            void **value, size_t *len) {
    mt_store_bytes b = mt_store_read_bytes(rd, MT_STORE_MAX_VALUE);
    if (rd->bad || rd->left) {
        s->broken = true;
        return mt_error(MT_ERR_PROTOCOL, "%s '%s': malformed reply from the store at %s", op, key,
                        s->addr);
    }
    char *copy = malloc(b.len + 1);
    if (!copy)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "%s '%s': out of memory for a %zu-byte value", op,
                        key, b.len);
    if (b.len) memcpy(copy, b.data, b.len);
    copy[b.len] = '\0';
    *value = copy;
    if (len) *len = b.len;
    return MT_OK;
}

mt_status mt_store_set(mt_store *s, const char *key, const void *value, size_t len) {
    MT_TRY(check_key(s, "set", key));
    MT_TRY(check_value(s, "set", key, len));
    pthread_mutex_lock(&s->mu);
    mt_store_buf_begin(&s->req, MT_STORE_OP_SET);
    put_key(s, key);
    mt_store_buf_bytes(&s->req, value, len);
    uint8_t *reply;
    size_t rlen;
    mt_status st = roundtrip(s, "set", key, quick_wait(s), &reply, &rlen);
    if (st == MT_OK) {
        if (reply[0] != MT_STORE_R_OK || rlen != 1) st = unexpected(s, "set", key, reply, rlen);
        free(reply);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

static mt_status get_common(mt_store *s, const char *op, const char *key, bool wait,
                            double timeout_s, void **value, size_t *len, bool *found) {
    *value = NULL;
    if (len) *len = 0;
    MT_TRY(check_key(s, op, key));
    timeout_s = resolve_timeout(timeout_s);
    pthread_mutex_lock(&s->mu);
    mt_store_buf_begin(&s->req, wait ? MT_STORE_OP_GET : MT_STORE_OP_TRY_GET);
    put_key(s, key);
    if (wait) mt_store_buf_u64(&s->req, (uint64_t)ceil(timeout_s * 1000.0));
    uint8_t *reply;
    size_t rlen;
    double reply_wait = wait ? blocking_wait(s, timeout_s) : quick_wait(s);
    mt_status st = roundtrip(s, op, key, reply_wait, &reply, &rlen);
    if (st == MT_OK) {
        mt_store_reader rd = {reply + 1, rlen - 1, false};
        if (reply[0] == MT_STORE_R_OK) {
            st = take_value(s, op, key, &rd, value, len);
            if (found) *found = st == MT_OK;
        } else if (!wait && reply[0] == MT_STORE_R_NOT_FOUND && rlen == 1) {
            *found = false;
        } else if (wait && reply[0] == MT_STORE_R_TIMEOUT && rlen == 1) {
            st = mt_error(MT_ERR_TIMEOUT, "timed out after %g s waiting for key '%s' to be set in "
                          "the store at %s", timeout_s, key, s->addr);
        } else {
            st = unexpected(s, op, key, reply, rlen);
        }
        free(reply);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

mt_status mt_store_get(mt_store *s, const char *key, double timeout_s, void **value,
                       size_t *len) {
    return get_common(s, "get", key, true, timeout_s, value, len, NULL);
}

mt_status mt_store_try_get(mt_store *s, const char *key, void **value, size_t *len, bool *found) {
    *found = false;
    return get_common(s, "try_get", key, false, 0, value, len, found);
}

mt_status mt_store_add(mt_store *s, const char *key, int64_t delta, int64_t *result) {
    MT_TRY(check_key(s, "add", key));
    pthread_mutex_lock(&s->mu);
    mt_store_buf_begin(&s->req, MT_STORE_OP_ADD);
    put_key(s, key);
    mt_store_buf_u64(&s->req, (uint64_t)delta);
    uint8_t *reply;
    size_t rlen;
    mt_status st = roundtrip(s, "add", key, quick_wait(s), &reply, &rlen);
    if (st == MT_OK) {
        if (reply[0] == MT_STORE_R_OK && rlen == 9) {
            mt_store_reader rd = {reply + 1, 8, false};
            int64_t v = (int64_t)mt_store_read_u64(&rd);
            if (result) *result = v;
        } else {
            st = unexpected(s, "add", key, reply, rlen);
        }
        free(reply);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

mt_status mt_store_compare_set(mt_store *s, const char *key, const void *expected,
                               size_t expected_len, const void *desired, size_t desired_len,
                               void **current, size_t *current_len) {
    *current = NULL;
    if (current_len) *current_len = 0;
    MT_TRY(check_key(s, "compare_set", key));
    MT_TRY(check_value(s, "compare_set", key, expected_len));
    MT_TRY(check_value(s, "compare_set", key, desired_len));
    pthread_mutex_lock(&s->mu);
    mt_store_buf_begin(&s->req, MT_STORE_OP_CAS);
    put_key(s, key);
    mt_store_buf_bytes(&s->req, expected, expected_len);
    mt_store_buf_bytes(&s->req, desired, desired_len);
    uint8_t *reply;
    size_t rlen;
    mt_status st = roundtrip(s, "compare_set", key, quick_wait(s), &reply, &rlen);
    if (st == MT_OK) {
        if (reply[0] == MT_STORE_R_OK && rlen >= 2) {
            mt_store_reader rd = {reply + 2, rlen - 2, false};
            st = take_value(s, "compare_set", key, &rd, current, current_len);
        } else {
            st = unexpected(s, "compare_set", key, reply, rlen);
        }
        free(reply);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

mt_status mt_store_delete(mt_store *s, const char *key, bool *existed) {
    if (existed) *existed = false;
    MT_TRY(check_key(s, "delete", key));
    pthread_mutex_lock(&s->mu);
    mt_store_buf_begin(&s->req, MT_STORE_OP_DELETE);
    put_key(s, key);
    uint8_t *reply;
    size_t rlen;
    mt_status st = roundtrip(s, "delete", key, quick_wait(s), &reply, &rlen);
    if (st == MT_OK) {
        if (reply[0] == MT_STORE_R_OK && rlen == 2) {
            if (existed) *existed = reply[1] != 0;
        } else {
            st = unexpected(s, "delete", key, reply, rlen);
        }
        free(reply);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

mt_status mt_store_stats(mt_store *s, mt_store_server_stats *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->mu);
    mt_store_buf_begin(&s->req, MT_STORE_OP_STATS);
    uint8_t *reply;
    size_t rlen;
    mt_status st = roundtrip(s, "stats", "-", mt_default_timeout(), &reply, &rlen);
    if (st == MT_OK) {
        mt_store_reader rd = {reply + 1, rlen - 1, false};
        out->kv_bytes = mt_store_read_u64(&rd);
        out->kv_peak = mt_store_read_u64(&rd);
        out->buffered_bytes = mt_store_read_u64(&rd);
        out->buffered_peak = mt_store_read_u64(&rd);
        out->total_peak = mt_store_read_u64(&rd);
        out->refused = mt_store_read_u64(&rd);
        out->busy = mt_store_read_u64(&rd);
        out->clients = mt_store_read_u32(&rd);
        out->clients_peak = mt_store_read_u32(&rd);
        out->max_clients = mt_store_read_u32(&rd);
        out->max_bytes = mt_store_read_u64(&rd);
        if (reply[0] != MT_STORE_R_OK || rd.bad || rd.left)
            st = unexpected(s, "stats", "-", reply, rlen);
        free(reply);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* Formats the missing keys of a TIMEOUT reply to a wait as "'a', 'b'" (and how many more). */
static void missing_keys(mt_store_reader *rd, char *out, size_t cap, uint32_t *missing) {
    *missing = mt_store_read_u32(rd);
    uint32_t listed = mt_store_read_u32(rd);
    size_t used = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < listed && !rd->bad; i++) {
        mt_store_bytes k = mt_store_read_bytes(rd, MT_STORE_MAX_KEY);
        if (rd->bad || used + 8 >= cap) break;
        int n = snprintf(out + used, cap - used, "%s'%.*s'", i ? ", " : "", (int)k.len,
                         (const char *)k.data);
        if (n > 0) used += (size_t)n < cap - used ? (size_t)n : cap - used - 1;
    }
    if (*missing > listed && used + 24 < cap)
        snprintf(out + used, cap - used, " and %u more", *missing - listed);
}

static mt_status wait_common(mt_store *s, const char *const *keys, int nkeys, double timeout_s,
                             bool any, int *which, void **value, size_t *value_len) {
    const char *op = any ? "wait_any" : "wait";
    if (nkeys <= 0 || nkeys > MT_STORE_MAX_WAIT_KEYS)
        return mt_error(MT_ERR_INVALID_ARG, "store at %s: %s for %d keys (1..%d allowed)", s->addr,
                        op, nkeys, MT_STORE_MAX_WAIT_KEYS);
    for (int i = 0; i < nkeys; i++) MT_TRY(check_key(s, op, keys[i]));
    timeout_s = resolve_timeout(timeout_s);
    pthread_mutex_lock(&s->mu);
    mt_store_buf_begin(&s->req, MT_STORE_OP_WAIT);
    mt_store_buf_u8(&s->req, any ? 1 : 0);
    mt_store_buf_u64(&s->req, (uint64_t)ceil(timeout_s * 1000.0));
    mt_store_buf_u32(&s->req, (uint32_t)nkeys);
    for (int i = 0; i < nkeys; i++) put_key(s, keys[i]);
    uint8_t *reply;
    size_t rlen;
    mt_status st = roundtrip(s, op, keys[0], blocking_wait(s, timeout_s), &reply, &rlen);
    if (st == MT_OK) {
        mt_store_reader rd = {reply + 1, rlen - 1, false};
        if (reply[0] == MT_STORE_R_OK && rlen >= 5 && (any || rlen == 5)) {
            uint32_t idx = mt_store_read_u32(&rd);
            if (which) *which = (int)idx;
            void *v = NULL;
            if (any) st = take_value(s, op, keys[0], &rd, &v, value_len);
            if (value)
                *value = v;
            else
                free(v);
        } else if (reply[0] == MT_STORE_R_TIMEOUT) {
            char names[1024];
            uint32_t missing;
            missing_keys(&rd, names, sizeof names, &missing);
            if (any)
                st = mt_error(MT_ERR_TIMEOUT, "timed out after %g s waiting for any of %d keys in "
                              "the store at %s: %s", timeout_s, nkeys, s->addr, names);
            else
                st = mt_error(MT_ERR_TIMEOUT, "timed out after %g s waiting for keys in the store "
                              "at %s: %u of %d still missing: %s", timeout_s, s->addr, missing,
                              nkeys, names);
        } else {
            st = unexpected(s, op, keys[0], reply, rlen);
        }
        free(reply);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

mt_status mt_store_wait(mt_store *s, const char *const *keys, int nkeys, double timeout_s) {
    return wait_common(s, keys, nkeys, timeout_s, false, NULL, NULL, NULL);
}

mt_status mt_store_wait_any(mt_store *s, const char *const *keys, int nkeys, double timeout_s,
                            int *which, void **value, size_t *len) {
    if (value) *value = NULL;
    return wait_common(s, keys, nkeys, timeout_s, true, which, value, len);
}

/* ---- barrier ------------------------------------------------------------------------------- */

/* Names the ranks whose arrival key for generation gen is missing: "ranks 2, 3 of 4". */
static void describe_missing(mt_store *s, const char *name, int64_t gen, int world, char *out,
                             size_t cap) {
    int missing = 0;
    size_t used = 0;
    char list[512] = "";
    for (int r = 0; r < world; r++) {
        char key[MT_STORE_MAX_KEY + 1];
        snprintf(key, sizeof key, "barrier/%s/%" PRId64 "/arrived/%d", name, gen, r);
        void *v = NULL;
        bool found = true;
        if (mt_store_try_get(s, key, &v, NULL, &found) != MT_OK) {
            snprintf(out, cap, "(the store could not be asked who arrived)");
            return;
        }
        free(v);
        if (found) continue;
        if (missing < 32 && used + 16 < sizeof list) {
            int n = snprintf(list + used, sizeof list - used, "%s%d", missing ? ", " : "", r);
            if (n > 0) used += (size_t)n;
        }
        missing++;
    }
    if (missing > 32)
        snprintf(out, cap, "ranks %s and %d more of %d never arrived", list, missing - 32, world);
    else if (missing > 1)
        snprintf(out, cap, "ranks %s of %d never arrived", list, world);
    else if (missing == 1)
        snprintf(out, cap, "rank %s of %d never arrived", list, world);
    else
        snprintf(out, cap, "every rank arrived but the barrier did not complete in time");
}

mt_status mt_store_barrier_abortable(mt_store *s, const char *name, int rank, int world,
                                     double timeout_s, const char *abort_key) {
    if (!name || !*name || world <= 0 || rank < 0 || rank >= world)
        return mt_error(MT_ERR_INVALID_ARG, "barrier '%s': rank %d and world size %d are invalid",
                        name ? name : "", rank, world);
    /* 64: room for "barrier/", "/<generation>/arrived/<rank>" and the like around the name */
    if (prefix_len(s) + strlen(name) > MT_STORE_MAX_KEY - 64)
        return mt_error(MT_ERR_INVALID_ARG, "barrier name '%.48s...' is too long", name);
    timeout_s = resolve_timeout(timeout_s);
    /* Arrivals count up forever; generation g is arrivals g*world+1 .. (g+1)*world, so a name is
     * reusable and each generation's keys are distinct. */
    char key[MT_STORE_MAX_KEY + 1], done[MT_STORE_MAX_KEY + 1];
    snprintf(key, sizeof key, "barrier/%s/count", name);
    int64_t n;
    MT_TRY(mt_store_add(s, key, 1, &n));
    int64_t gen = (n - 1) / world;
    snprintf(key, sizeof key, "barrier/%s/%" PRId64 "/arrived/%d", name, gen, rank);
    MT_TRY(mt_store_set(s, key, "1", 1));
    if (gen > 0) {
        /* Everyone of generation gen-1 has left it (they are all counted in gen): clean up. */
        snprintf(key, sizeof key, "barrier/%s/%" PRId64 "/arrived/%d", name, gen - 1, rank);
        MT_TRY(mt_store_delete(s, key, NULL));
    }
    snprintf(done, sizeof done, "barrier/%s/%" PRId64 "/done", name, gen);
    if (n % world == 0) {
        MT_TRY(mt_store_set(s, done, "1", 1));
        if (gen > 0) {
            snprintf(key, sizeof key, "barrier/%s/%" PRId64 "/done", name, gen - 1);
            MT_TRY(mt_store_delete(s, key, NULL));
        }
    }
    const char *keys[2] = {done, abort_key};
    int which = 0;
    void *v = NULL;
    mt_status st = mt_store_wait_any(s, keys, abort_key ? 2 : 1, timeout_s, &which, &v, NULL);
    if (st == MT_ERR_TIMEOUT) {
        char who[700];
        describe_missing(s, name, gen, world, who, sizeof who);
        return mt_error(MT_ERR_TIMEOUT, "barrier '%s' timed out after %g s: %s", name, timeout_s,
                        who);
    }
    if (st != MT_OK) return mt_error_wrap(st, "barrier '%s'", name);
    if (which == 1) {
        mt_status code;
        const char *msg = mt_store_abort_parse(v, &code);
        st = mt_error(code, "barrier '%s' stopped because another process failed: %s", name, msg);
    }
    free(v);
    return st;
}

mt_status mt_store_barrier(mt_store *store, const char *name, int rank, int world,
                           double timeout_s) {
    return mt_store_barrier_abortable(store, name, rank, world, timeout_s, NULL);
}

/* The abort value is "<status> <message>". */
const char *mt_store_abort_parse(const char *value, mt_status *status) {
    int code = 0, off = 0;
    *status = MT_ERR_INTERNAL;
    if (!value) return "";
    if (sscanf(value, "%d %n", &code, &off) != 1 || code <= 0 || code >= MT_STATUS_COUNT)
        return value;
    *status = (mt_status)code;
    return value + off;
}

mt_status mt_store_abort(mt_store *store, const char *abort_key, mt_status status,
                         const char *message) {
    char value[4096];
    int n = snprintf(value, sizeof value, "%d %s", (int)status, message ? message : "");
    size_t len = n < 0 ? 0 : (size_t)n < sizeof value ? (size_t)n : sizeof value - 1;
    void *current = NULL;
    /* Only the first failure is kept: it is the cause, later ones are consequences. */
    mt_status st = mt_store_compare_set(store, abort_key, "", 0, value, len, &current, NULL);
    free(current);
    return st;
}
