/* The rendezvous store: every operation against an in-process server on a free port, the size
 * limits, and misbehaving clients on raw sockets. After each bad client the server must still
 * serve a good one, and the good client's error messages must say what matters. */
#include "check.h"
#include "store/store_raw.h"

#include "core/clock.h"

#include "store/store_internal.h"
#include "store/wire.h"

#include <meshtrain/store.h>
#include <meshtrain/version.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define JOB "job-A"

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static bool has(const char *text, const char *word) { return strstr(text, word) != NULL; }

/* ---- raw sockets (store_raw.h) ------------------------------------------------------------ */

/* A raw connection that has passed the handshake (as a client without a token, like the server). */
static int raw_greeted(int port) {
    int fd = raw_connect(port);
    bool retry;
    CHECK(fd >= 0);
    CHECK_OK(mt_store_client_handshake(fd, "raw", JOB, mt_version(), "", mt_clock_now_s() + 5,
                                       &retry));
    return fd;
}

/* The server still answers a good client and keeps the data it had. */
static void still_serves(mt_store *good, const char *after) {
    void *v = NULL;
    size_t n = 0;
    mt_status s = mt_store_get(good, "alive", 5, &v, &n);
    CHECK_MSG(s == MT_OK && n == 3 && memcmp(v, "yes", 3) == 0, "after %s: %s", after,
              mt_last_error());
    free(v);
    int64_t r = 0;
    CHECK_OK(mt_store_add(good, "alive/count", 1, &r));
}

/* ---- operations ---------------------------------------------------------------------------- */

static void test_basic_ops(mt_store *c) {
    CHECK_OK(mt_store_set(c, "a", "hello", 5));
    void *v = NULL;
    size_t n = 0;
    CHECK_OK(mt_store_get(c, "a", 1, &v, &n));
    CHECK(n == 5 && memcmp(v, "hello", 5) == 0 && ((char *)v)[5] == '\0');
    free(v);

    CHECK_OK(mt_store_set(c, "a", "", 0)); /* replace with an empty value */
    CHECK_OK(mt_store_get(c, "a", 1, &v, &n));
    CHECK(n == 0 && v && ((char *)v)[0] == '\0');
    free(v);

    bool found = true;
    CHECK_OK(mt_store_try_get(c, "missing", &v, &n, &found));
    CHECK(!found && v == NULL);
    CHECK_OK(mt_store_try_get(c, "a", &v, &n, &found));
    CHECK(found && n == 0);
    free(v);

    int64_t r = 0;
    CHECK_OK(mt_store_add(c, "ctr", 5, &r));
    CHECK(r == 5);
    CHECK_OK(mt_store_add(c, "ctr", -7, &r));
    CHECK(r == -2);
    CHECK_OK(mt_store_get(c, "ctr", 1, &v, &n));
    CHECK(n == 2 && memcmp(v, "-2", 2) == 0);
    free(v);
    CHECK_OK(mt_store_set(c, "text", "abc", 3));
    CHECK_ERR(mt_store_add(c, "text", 1, &r), MT_ERR_INVALID_ARG, "add", "text", "not an integer");
    CHECK_OK(mt_store_set(c, "big", "9223372036854775807", 19));
    CHECK_ERR(mt_store_add(c, "big", 1, &r), MT_ERR_INVALID_ARG, "overflow");

    /* compare_set: a missing key matches an empty expected value. */
    void *cur = NULL;
    size_t cl = 0;
    CHECK_OK(mt_store_compare_set(c, "cas", "", 0, "one", 3, &cur, &cl));
    CHECK(cl == 3 && memcmp(cur, "one", 3) == 0);
    free(cur);
    CHECK_OK(mt_store_compare_set(c, "cas", "zzz", 3, "two", 3, &cur, &cl));
    CHECK(cl == 3 && memcmp(cur, "one", 3) == 0); /* no match: unchanged */
    free(cur);
    CHECK_OK(mt_store_compare_set(c, "cas", "one", 3, "two", 3, &cur, &cl));
    CHECK(cl == 3 && memcmp(cur, "two", 3) == 0);
    free(cur);
    CHECK_OK(mt_store_compare_set(c, "cas-missing", "x", 1, "y", 1, &cur, &cl));
    CHECK(cl == 0);
    free(cur);
    CHECK_OK(mt_store_try_get(c, "cas-missing", &v, &n, &found));
    CHECK(!found);

    const char *present[] = {"a", "ctr", "cas"};
    CHECK_OK(mt_store_wait(c, present, 3, 1));
    const char *some[] = {"a", "nope-1", "ctr", "nope-2"};
    CHECK_ERR(mt_store_wait(c, some, 4, 0.2), MT_ERR_TIMEOUT, "2 of 4", "'nope-1'", "'nope-2'",
              "timed out");
    int which = -1;
    const char *any[] = {"nope-1", "ctr"};
    CHECK_OK(mt_store_wait_any(c, any, 2, 1, &which, &v, &n));
    CHECK(which == 1 && n == 2 && v && strcmp(v, "-2") == 0);
    free(v);
    CHECK_ERR(mt_store_wait_any(c, any, 1, 0.1, &which, &v, &n), MT_ERR_TIMEOUT, "'nope-1'");

    bool existed = false;
    CHECK_OK(mt_store_delete(c, "a", &existed));
    CHECK(existed);
    CHECK_OK(mt_store_delete(c, "a", &existed));
    CHECK(!existed);
    CHECK_OK(mt_store_try_get(c, "a", &v, &n, &found));
    CHECK(!found);

    CHECK_ERR(mt_store_get(c, "never-set", 0.3, &v, &n), MT_ERR_TIMEOUT, "never-set", "timed out",
              "0.3 s", "127.0.0.1:");
    CHECK_ERR(mt_store_set(c, "", "x", 1), MT_ERR_INVALID_ARG, "empty key");
}

typedef struct setter_arg {
    int port;
    int delay_ms;
} setter_arg;

static void *delayed_setter(void *p) {
    setter_arg *a = p;
    mt_store *c;
    if (mt_store_connect("127.0.0.1", a->port, JOB, 5, &c) != MT_OK) return NULL;
    sleep_ms(a->delay_ms);
    mt_store_set(c, "late", "here", 4);
    mt_store_close(c);
    return NULL;
}

/* A get waits on the server until another client sets the key. */
static void test_blocking_get(int port, mt_store *c) {
    setter_arg a = {port, 200};
    pthread_t t;
    pthread_create(&t, NULL, delayed_setter, &a);
    void *v = NULL;
    size_t n = 0;
    CHECK_OK(mt_store_get(c, "late", 10, &v, &n));
    CHECK(n == 4 && v && memcmp(v, "here", 4) == 0);
    free(v);
    pthread_join(t, NULL);
}

static void test_limits(mt_store *c) {
    size_t max = MT_STORE_MAX_VALUE;
    char *big = malloc(max + 1);
    for (size_t i = 0; i < max + 1; i++) big[i] = (char)(i * 7 + 3);
    CHECK_OK(mt_store_set(c, "max-value", big, max));
    void *v = NULL;
    size_t n = 0;
    CHECK_OK(mt_store_get(c, "max-value", 10, &v, &n));
    CHECK(n == max && v && memcmp(v, big, max) == 0);
    free(v);
    CHECK_ERR(mt_store_set(c, "too-big", big, max + 1), MT_ERR_INVALID_ARG, "too-big",
              "MT_STORE_MAX_VALUE", "67108865");
    void *cur = NULL;
    CHECK_ERR(mt_store_compare_set(c, "too-big", "", 0, big, max + 1, &cur, NULL),
              MT_ERR_INVALID_ARG, "MT_STORE_MAX_VALUE");
    free(big);

    char key[MT_STORE_MAX_KEY + 2];
    memset(key, 'k', sizeof key);
    key[MT_STORE_MAX_KEY] = '\0';
    CHECK_OK(mt_store_set(c, key, "x", 1));
    CHECK_OK(mt_store_get(c, key, 1, &v, &n));
    CHECK(n == 1);
    free(v);
    key[MT_STORE_MAX_KEY] = 'k';
    key[MT_STORE_MAX_KEY + 1] = '\0';
    CHECK_ERR(mt_store_set(c, key, "x", 1), MT_ERR_INVALID_ARG, "MT_STORE_MAX_KEY", "1025");
}

/* ---- barrier ------------------------------------------------------------------------------- */

typedef struct barrier_arg {
    int port, rank, world, rounds;
    mt_status status;
    int order_errors;
} barrier_arg;

static int round_counter[16];

static void *barrier_member(void *p) {
    barrier_arg *a = p;
    mt_store *c;
    a->status = mt_store_connect("127.0.0.1", a->port, JOB, 5, &c);
    if (a->status != MT_OK) return NULL;
    for (int r = 0; r < a->rounds && a->status == MT_OK; r++) {
        __atomic_add_fetch(&round_counter[r], 1, __ATOMIC_SEQ_CST);
        if (a->rank == r % a->world) sleep_ms(50); /* a different straggler each round */
        a->status = mt_store_barrier(c, "loop", a->rank, a->world, 10);
        /* Nobody leaves round r before all have entered it. */
        if (__atomic_load_n(&round_counter[r], __ATOMIC_SEQ_CST) != a->world)
            a->order_errors++;
    }
    mt_store_close(c);
    return NULL;
}

/* Rounds of a restarted job share one store through key prefixes: every operation of a client
 * with a prefix lands under it, and the same key of another round is another key. */
static void test_prefix(int port, mt_store *plain) {
    mt_store *r1 = NULL;
    CHECK_OK(mt_store_connect("127.0.0.1", port, JOB, 5, &r1));
    if (!r1) return;
    CHECK_OK(mt_store_set_prefix(r1, "round/1/"));
    CHECK_OK(mt_store_set(r1, "k", "one", 3));
    int64_t n = 0;
    CHECK_OK(mt_store_add(r1, "count", 2, &n));
    const char *keys[] = {"k", "count"};
    CHECK_OK(mt_store_wait(r1, keys, 2, 1));
    void *v = NULL;
    bool found = true;
    CHECK_OK(mt_store_try_get(plain, "k", &v, NULL, &found));
    CHECK(!found); /* not in the unprefixed key space */
    free(v);
    v = NULL;
    CHECK_OK(mt_store_get(plain, "round/1/k", 1, &v, NULL));
    CHECK(v && strcmp(v, "one") == 0);
    free(v);
    v = NULL;
    CHECK_OK(mt_store_get(plain, "round/1/count", 1, &v, NULL));
    CHECK(v && strcmp(v, "2") == 0);
    free(v);
    char long_prefix[MT_STORE_MAX_PREFIX + 2];
    memset(long_prefix, 'p', sizeof long_prefix - 1);
    long_prefix[sizeof long_prefix - 1] = '\0';
    CHECK_ERR(mt_store_set_prefix(r1, long_prefix), MT_ERR_INVALID_ARG, "key prefix");
    /* The longest prefix counts against the key and barrier name limits. */
    long_prefix[MT_STORE_MAX_PREFIX] = '\0';
    CHECK_OK(mt_store_set_prefix(r1, long_prefix));
    static char name[MT_STORE_MAX_KEY + 1];
    memset(name, 'n', MT_STORE_MAX_KEY - MT_STORE_MAX_PREFIX + 1);
    name[MT_STORE_MAX_KEY - MT_STORE_MAX_PREFIX + 1] = '\0';
    CHECK_ERR(mt_store_set(r1, name, "x", 1), MT_ERR_INVALID_ARG, "MT_STORE_MAX_KEY");
    name[MT_STORE_MAX_KEY - MT_STORE_MAX_PREFIX] = '\0';
    CHECK_OK(mt_store_set(r1, name, "x", 1));
    name[MT_STORE_MAX_KEY - 64 - MT_STORE_MAX_PREFIX + 1] = '\0';
    CHECK_ERR(mt_store_barrier(r1, name, 0, 1, 5), MT_ERR_INVALID_ARG, "barrier name",
              "is too long");
    name[MT_STORE_MAX_KEY - 64 - MT_STORE_MAX_PREFIX] = '\0';
    CHECK_OK(mt_store_barrier(r1, name, 0, 1, 5));
    mt_store_close(r1);
}

static void test_barrier(int port, mt_store *c) {
    enum { WORLD = 3, ROUNDS = 5 };
    pthread_t t[WORLD];
    barrier_arg a[WORLD];
    for (int i = 0; i < WORLD; i++) {
        a[i] = (barrier_arg){port, i, WORLD, ROUNDS, MT_OK, 0};
        pthread_create(&t[i], NULL, barrier_member, &a[i]);
    }
    for (int i = 0; i < WORLD; i++) {
        pthread_join(t[i], NULL);
        CHECK_MSG(a[i].status == MT_OK, "member %d: %s", i, mt_status_str(a[i].status));
        CHECK(a[i].order_errors == 0);
    }
    /* Old generations are cleaned up: only the newest generation's keys remain. */
    void *v = NULL;
    bool found = true;
    CHECK_OK(mt_store_try_get(c, "barrier/loop/0/arrived/0", &v, NULL, &found));
    CHECK(!found);
    free(v);

    CHECK_ERR(mt_store_barrier(c, "init", 0, 4, 0.5), MT_ERR_TIMEOUT,
              "barrier 'init' timed out after 0.5 s: ranks 1, 2, 3 of 4 never arrived");
    CHECK_ERR(mt_store_barrier(c, "pair", 1, 2, 0.3), MT_ERR_TIMEOUT,
              "rank 0 of 2 never arrived");

    CHECK_OK(mt_store_abort(c, "job/abort", MT_ERR_MISMATCH, "rank 3: world size mismatch"));
    CHECK_ERR(mt_store_barrier_abortable(c, "ab", 0, 2, 5, "job/abort"), MT_ERR_MISMATCH,
              "barrier 'ab'", "world size mismatch");
}

/* ---- misbehaving clients ------------------------------------------------------------------- */

static void test_bad_clients(int port, mt_store_server *server, mt_store *good) {
    CHECK_OK(mt_store_set(good, "alive", "yes", 3));
    int base = mt_store_server_clients(server);

    int fd = raw_connect(port); /* not a meshtrain client at all */
    CHECK(raw_send(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27));
    CHECK_MSG(raw_closed_within(fd, 3000), "garbage client not dropped");
    close(fd);
    still_serves(good, "garbage");

    fd = raw_connect(port); /* a huge length prefix */
    CHECK(raw_send(fd, "\xff\xff\xff\xff", 4));
    CHECK_MSG(raw_closed_within(fd, 3000), "huge length prefix not dropped");
    close(fd);
    still_serves(good, "huge length prefix");

    fd = raw_connect(port); /* a small frame with a wrong magic */
    CHECK(raw_send(fd, "\0\0\0\x0b\x01XXXXYYYY\0\0", 15));
    CHECK_MSG(raw_closed_within(fd, 3000), "wrong magic not dropped");
    close(fd);
    still_serves(good, "wrong magic");

    fd = raw_greeted(port); /* an unknown opcode after a good handshake */
    CHECK(raw_send(fd, "\0\0\0\x03\x7f\x01\x02", 7));
    CHECK_MSG(raw_closed_within(fd, 3000), "unknown opcode not dropped");
    close(fd);
    still_serves(good, "unknown opcode");

    fd = raw_connect(port); /* a request before the handshake */
    mt_store_buf b = {0};
    mt_store_buf_begin(&b, MT_STORE_OP_SET);
    mt_store_buf_str(&b, "alive");
    mt_store_buf_str(&b, "hacked");
    mt_store_buf_finish(&b);
    CHECK(raw_send(fd, b.data, b.len));
    CHECK_MSG(raw_closed_within(fd, 3000), "request before handshake not dropped");
    close(fd);
    still_serves(good, "request before handshake");

    fd = raw_greeted(port); /* a key over the limit (sent by hand, bypassing the client) */
    char key[MT_STORE_MAX_KEY + 2];
    memset(key, 'q', sizeof key - 1);
    key[sizeof key - 1] = '\0';
    mt_store_buf_begin(&b, MT_STORE_OP_SET);
    mt_store_buf_str(&b, key);
    mt_store_buf_str(&b, "v");
    mt_store_buf_finish(&b);
    CHECK(raw_send(fd, b.data, b.len));
    CHECK_MSG(raw_closed_within(fd, 3000), "oversized key not dropped");
    close(fd);
    still_serves(good, "oversized key");

    fd = raw_greeted(port); /* a value one byte over the limit, sent in full */
    size_t over = (size_t)MT_STORE_MAX_VALUE + 1;
    char *blob = calloc(1, over);
    mt_store_buf_begin(&b, MT_STORE_OP_SET);
    mt_store_buf_str(&b, "blob");
    mt_store_buf_bytes(&b, blob, over);
    mt_store_buf_finish(&b);
    free(blob);
    raw_send(fd, b.data, b.len); /* the server may close before it has read everything */
    CHECK_MSG(raw_closed_within(fd, 5000), "oversized value not dropped");
    close(fd);
    still_serves(good, "oversized value");
    bool found = true;
    void *v = NULL;
    CHECK_OK(mt_store_try_get(good, "blob", &v, NULL, &found));
    CHECK(!found);

    fd = raw_greeted(port); /* disconnects in the middle of a frame */
    mt_store_buf_begin(&b, MT_STORE_OP_SET);
    mt_store_buf_str(&b, "partial");
    mt_store_buf_str(&b, "0123456789");
    mt_store_buf_finish(&b);
    CHECK(raw_send(fd, b.data, b.len - 6));
    sleep_ms(50);
    close(fd);
    still_serves(good, "mid-frame disconnect");
    CHECK_OK(mt_store_try_get(good, "partial", &v, NULL, &found));
    CHECK(!found);

    fd = raw_greeted(port); /* a valid request whose sender never reads the reply, then leaves */
    mt_store_buf_begin(&b, MT_STORE_OP_GET);
    mt_store_buf_str(&b, "never");
    mt_store_buf_u64(&b, 60000);
    mt_store_buf_finish(&b);
    CHECK(raw_send(fd, b.data, b.len));
    sleep_ms(50);
    close(fd);
    still_serves(good, "a blocked client that left");
    mt_store_buf_free(&b);

    /* A wrong job id and a wrong version are refused with a clear message. */
    mt_store *other = NULL;
    CHECK_ERR(mt_store_connect("127.0.0.1", port, "job-B", 5, &other), MT_ERR_MISMATCH,
              "belongs to job 'job-A'", "this process is in job 'job-B'");
    CHECK(other == NULL);
    char expect[160];
    /* A version no build has: the refusal must not depend on which version this one is. */
    snprintf(expect, sizeof expect, "meshtrain version mismatch: server %s, client 0.0.0-other: "
             "mixed builds are not supported", mt_version());
    CHECK_ERR(mt_store_connect_version("127.0.0.1", port, JOB, "0.0.0-other", 5, &other),
              MT_ERR_MISMATCH, expect);
    still_serves(good, "refused handshakes");

    /* Every bad client is gone: only the good ones remain connected. */
    int now = -1;
    for (int i = 0; i < 300 && (now = mt_store_server_clients(server)) != base; i++) sleep_ms(10);
    CHECK_MSG(now == base, "%d clients connected, expected %d", now, base);
}

/* A client that connects and says nothing is dropped after the handshake deadline, and others
 * are served meanwhile. */
static void test_silent_client(void) {
    setenv("MT_STORE_HANDSHAKE_TIMEOUT_S", "0.5", 1);
    mt_store_server *server;
    CHECK_OK(mt_store_server_start("127.0.0.1", 0, JOB, &server));
    unsetenv("MT_STORE_HANDSHAKE_TIMEOUT_S");
    if (!server) return;
    int port = mt_store_server_port(server);
    int silent = raw_connect(port);
    int half = raw_connect(port); /* sends half a length prefix, then nothing */
    CHECK(raw_send(half, "\0\0", 2));
    mt_store *good;
    CHECK_OK(mt_store_connect("127.0.0.1", port, JOB, 5, &good));
    CHECK_OK(mt_store_set(good, "alive", "yes", 3));
    still_serves(good, "silent client connected");
    CHECK_MSG(raw_closed_within(silent, 5000), "silent client not dropped");
    CHECK_MSG(raw_closed_within(half, 5000), "half-header client not dropped");
    close(silent);
    close(half);
    still_serves(good, "silent client dropped");
    mt_store_close(good);
    mt_store_server_stop(server);
}

/* ---- connecting ---------------------------------------------------------------------------- */

typedef struct connect_arg {
    int port;
    mt_status status;
} connect_arg;

static void *late_client(void *p) {
    connect_arg *a = p;
    mt_store *c = NULL;
    a->status = mt_store_connect("127.0.0.1", a->port, JOB, 10, &c);
    if (a->status == MT_OK) {
        void *v = NULL;
        a->status = mt_store_get(c, "k", 5, &v, NULL);
        free(v);
    }
    mt_store_close(c);
    return NULL;
}

static void test_connect_order_and_loss(void) {
    mt_store_server *server;
    CHECK_OK(mt_store_server_start(NULL, 0, JOB, &server));
    if (!server) return;
    int port = mt_store_server_port(server);
    mt_store_server_stop(server);

    mt_store *c = NULL;
    CHECK_ERR(mt_store_connect("127.0.0.1", port, JOB, 0.3, &c), MT_ERR_TIMEOUT,
              "could not connect to the store at 127.0.0.1:", "0.3 s");

    /* The client starts first and retries until the server is there. */
    connect_arg a = {port, MT_ERR_INTERNAL};
    pthread_t t;
    pthread_create(&t, NULL, late_client, &a);
    sleep_ms(300);
    CHECK_OK(mt_store_server_start(NULL, port, JOB, &server));
    if (!server) {
        pthread_join(t, NULL);
        return;
    }
    mt_store_server *second = NULL;
    CHECK_ERR(mt_store_server_start(NULL, port, JOB, &second), MT_ERR_IO, "cannot listen",
              "already in use", "MASTER_PORT");
    CHECK(second == NULL);
    mt_store *setter;
    CHECK_OK(mt_store_connect("127.0.0.1", port, JOB, 5, &setter));
    CHECK_OK(mt_store_set(setter, "k", "v", 1));
    pthread_join(t, NULL);
    CHECK_MSG(a.status == MT_OK, "late client: %s", mt_status_str(a.status));

    /* The server goes away: the client's next call names the store and says it was lost. */
    mt_store_server_stop(server);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    CHECK_ERR(mt_store_set(setter, "k", "v", 1), MT_ERR_PEER_LOST, addr, "lost the connection");
    CHECK_ERR(mt_store_set(setter, "k", "v", 1), MT_ERR_PEER_LOST, addr);
    mt_store_close(setter);
}

static void test_default_timeout(void) {
    unsetenv("MT_TIMEOUT_S");
    CHECK(mt_default_timeout() == 300);
    setenv("MT_TIMEOUT_S", "2.5", 1);
    CHECK(mt_default_timeout() == 2.5);
    setenv("MT_TIMEOUT_S", "abc", 1);
    CHECK(mt_default_timeout() == 300);
    setenv("MT_TIMEOUT_S", "-4", 1);
    CHECK(mt_default_timeout() == 300);
    unsetenv("MT_TIMEOUT_S");
}

int main(void) {
    test_default_timeout();
    mt_store_server *server = NULL;
    CHECK_OK(mt_store_server_start("127.0.0.1", 0, JOB, &server));
    if (!server) return check_report("test_store");
    int port = mt_store_server_port(server);
    CHECK(port > 0);
    mt_store *c = NULL;
    CHECK_OK(mt_store_connect("127.0.0.1", port, JOB, 5, &c));
    if (c) {
        CHECK(has(mt_store_address(c), "127.0.0.1:"));
        test_basic_ops(c);
        test_blocking_get(port, c);
        test_limits(c);
        test_prefix(port, c);
    test_barrier(port, c);
        test_bad_clients(port, server, c);
        mt_store_close(c);
    }
    mt_store_server_stop(server);
    test_silent_client();
    test_connect_order_and_loss();
    return check_report("test_store");
}
