/* The store's security and bounds (docs/security.md): the token handshake with the right, a
 * wrong and no token; what a stranger gets back, byte for byte; the pre-authentication frame
 * limit; the client limit; the key-value byte limit; the range checks of MT_STORE_*; and the
 * server's memory counters under a crowd of abusive connections. */
#include "check.h"
#include "store/store_raw.h"

#include "core/clock.h"
#include "store/auth.h"
#include "store/store_internal.h"
#include "store/wire.h"

#include <meshtrain/store.h>
#include <meshtrain/version.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define JOB "job-secret-A"
#define TOKEN "0123456789abcdef0123456789abcdef-token-A"
#define OTHER "0123456789abcdef0123456789abcdef-token-B"

static mt_store_server *start(const char *token, int max_clients, uint64_t max_bytes) {
    mt_store_server_opts o = {.bind_addr = "127.0.0.1", .job_id = JOB, .token = token,
                              .max_clients = max_clients, .max_bytes = max_bytes};
    mt_store_server *s = NULL;
    int listen_err;
    CHECK_OK(mt_store_server_start_opts(&o, &s, &listen_err));
    return s;
}

static mt_status join(int port, const char *token, double timeout_s, mt_store **out) {
    return mt_store_connect_token("127.0.0.1", port, JOB, mt_version(), token, timeout_s, out);
}

static bool contains(const unsigned char *buf, size_t n, const char *text) {
    size_t k = strlen(text);
    for (size_t i = 0; k && i + k <= n; i++)
        if (memcmp(buf + i, text, k) == 0) return true;
    return false;
}

/* ---- the handshake ------------------------------------------------------------------------- */

static void test_tokens(void) {
    mt_store_server *server = start(TOKEN, 0, 0);
    if (!server) return;
    int port = mt_store_server_port(server);
    mt_store *good = NULL, *bad = NULL;
    CHECK_OK(join(port, TOKEN, 5, &good));
    if (good) CHECK_OK(mt_store_set(good, "secret", "42", 2));

    /* A wrong token and no token are refused at once: the refusal is final, not retried until
     * the connect deadline. */
    double t0 = mt_clock_now_s();
    CHECK_ERR(join(port, OTHER, 20, &bad), MT_ERR_MISMATCH, "refused the handshake",
              "does not accept");
    CHECK_ERR(join(port, "", 20, &bad), MT_ERR_MISMATCH, "refused the handshake",
              "has no store token");
    CHECK_MSG(mt_clock_now_s() - t0 < 5, "refusals took %.1f s", mt_clock_now_s() - t0);
    CHECK(bad == NULL);

    /* The refused clients are gone; the good one is still served. */
    void *v = NULL;
    if (good) CHECK_OK(mt_store_get(good, "secret", 5, &v, NULL));
    CHECK(v && strcmp(v, "42") == 0);
    free(v);

    /* The token from the environment, as mtrun hands it to its ranks. */
    setenv("MT_STORE_TOKEN", TOKEN, 1);
    mt_store *from_env = NULL;
    CHECK_OK(mt_store_connect("127.0.0.1", port, JOB, 5, &from_env));
    mt_store_close(from_env);
    setenv("MT_STORE_TOKEN", "too-short", 1);
    CHECK_ERR(mt_store_connect("127.0.0.1", port, JOB, 5, &from_env), MT_ERR_INVALID_ARG,
              "MT_STORE_TOKEN is 9 bytes long", "32..1024");
    unsetenv("MT_STORE_TOKEN");

    /* Authenticated clients of another job or build still get the friendly messages. */
    mt_store *other = NULL;
    CHECK_ERR(mt_store_connect_token("127.0.0.1", port, "job-B", mt_version(), TOKEN, 5, &other),
              MT_ERR_MISMATCH, "belongs to job '" JOB "'", "this process is in job 'job-B'");
    CHECK_ERR(mt_store_connect_token("127.0.0.1", port, JOB, "0.0.0-other", TOKEN, 5, &other),
              MT_ERR_MISMATCH, "meshtrain version mismatch", "client 0.0.0-other");
    mt_store_close(good);
    mt_store_server_stop(server);

    /* A client with a token does not take a tokenless store for its own either. */
    server = start("", 0, 0);
    if (!server) return;
    CHECK_ERR(join(mt_store_server_port(server), TOKEN, 5, &bad), MT_ERR_MISMATCH,
              "refused the handshake");
    mt_store_server_stop(server);
}

/* Sends a HELLO (built in *b) and reads the challenge into got (at least 41 bytes). */
static void send_hello(int fd, mt_store_buf *b, unsigned char *got) {
    uint8_t nonce[MT_STORE_NONCE_LEN] = {7};
    mt_store_buf_begin(b, MT_STORE_OP_HELLO);
    mt_store_buf_u32(b, MT_STORE_MAGIC);
    mt_store_buf_u32(b, MT_STORE_HANDSHAKE_FORMAT);
    mt_store_buf_bytes(b, nonce, sizeof nonce);
    mt_store_buf_finish(b);
    CHECK(raw_send(fd, b->data, b->len));
    CHECK(recv(fd, got, 4 + 1 + 4 + MT_STORE_NONCE_LEN, MSG_WAITALL) ==
          4 + 1 + 4 + MT_STORE_NONCE_LEN);
}

/* A stranger (no token) sends a HELLO, then an AUTH with a wrong MAC, another version and
 * another job: all it gets back is 32 random bytes and the one-byte refusal. */
static void test_stranger_learns_nothing(void) {
    mt_store_server *server = start(TOKEN, 0, 0);
    if (!server) return;
    int port = mt_store_server_port(server);
    int fd = raw_connect(port);
    mt_store_buf b = {0};
    unsigned char got[256];
    send_hello(fd, &b, got);
    CHECK(mt_store_get_be32(got) == 1 + 4 + MT_STORE_NONCE_LEN && got[4] == MT_STORE_R_OK);

    uint8_t mac[MT_STORE_MAC_LEN] = {0};
    mt_store_buf_begin(&b, MT_STORE_OP_AUTH);
    mt_store_buf_u32(&b, MT_STORE_PROTO_VERSION + 7);
    mt_store_buf_str(&b, "0.0.0-other");
    mt_store_buf_str(&b, "job-guess");
    mt_store_buf_bytes(&b, mac, sizeof mac);
    mt_store_buf_finish(&b);
    CHECK(raw_send(fd, b.data, b.len));
    size_t total = 0;
    bool closed = false;
    size_t n = raw_read_until_closed(fd, 3000, got, sizeof got, &total, &closed);
    static const unsigned char refused[5] = {0, 0, 0, 1, MT_STORE_R_REFUSED};
    CHECK_MSG(closed && n == 5 && total == 5 && memcmp(got, refused, 5) == 0,
              "a wrong MAC got %zu bytes back (closed: %d), not the 5-byte refusal", total,
              closed);
    CHECK(!contains(got, n, JOB) && !contains(got, n, mt_version()));
    close(fd);

    /* A client of meshtrain <= 0.3.0 (format 1: version and job id in the clear) gets the same
     * refusal, not the server's version or job id. */
    fd = raw_connect(port);
    mt_store_buf_begin(&b, MT_STORE_OP_HELLO);
    mt_store_buf_u32(&b, MT_STORE_MAGIC);
    mt_store_buf_u32(&b, 1);
    mt_store_buf_str(&b, "0.2.0");
    mt_store_buf_str(&b, "none");
    mt_store_buf_finish(&b);
    CHECK(raw_send(fd, b.data, b.len));
    n = raw_read_until_closed(fd, 3000, got, sizeof got, &total, &closed);
    CHECK_MSG(closed && n == 5 && total == 5 && memcmp(got, refused, 5) == 0,
              "an old-format HELLO got %zu bytes back (closed: %d)", total, closed);
    CHECK(!contains(got, n, JOB) && !contains(got, n, mt_version()));
    close(fd);

    /* A request before the handshake: the same refusal, and nothing is written. */
    fd = raw_connect(port);
    mt_store_buf_begin(&b, MT_STORE_OP_SET);
    mt_store_buf_str(&b, "mtrun/r0/failure");
    mt_store_buf_str(&b, "1\nstopped by a stranger");
    mt_store_buf_finish(&b);
    CHECK(raw_send(fd, b.data, b.len));
    n = raw_read_until_closed(fd, 3000, got, sizeof got, &total, &closed);
    CHECK(closed && total == 5 && memcmp(got, refused, 5) == 0);
    close(fd);
    mt_store_buf_free(&b);
    mt_store *good = NULL;
    CHECK_OK(join(port, TOKEN, 5, &good));
    bool found = true;
    void *v = NULL;
    if (good) CHECK_OK(mt_store_try_get(good, "mtrun/r0/failure", &v, NULL, &found));
    CHECK(!found);
    free(v);
    mt_store_close(good);
    mt_store_server_stop(server);
}

/* A stranger listening on the store's port answers like a store but cannot prove it knows the
 * token: the client believes nothing it says. */
static void *fake_store(void *arg) {
    int lfd = *(int *)arg;
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) return NULL;
    unsigned char in[1024];
    ssize_t n = recv(fd, in, sizeof in, 0); /* HELLO */
    unsigned char challenge[4 + 1 + 4 + MT_STORE_NONCE_LEN] = {0, 0, 0, 37, MT_STORE_R_OK, 0, 0, 0,
                                                               MT_STORE_NONCE_LEN};
    if (n > 0) raw_send(fd, challenge, sizeof challenge);
    n = recv(fd, in, sizeof in, 0); /* AUTH */
    unsigned char ok[4 + 1 + 4 + MT_STORE_MAC_LEN] = {0, 0, 0, 37, MT_STORE_R_OK, 0, 0, 0,
                                                      MT_STORE_MAC_LEN};
    if (n > 0) raw_send(fd, ok, sizeof ok);
    unsigned char sink[64];
    while (recv(fd, sink, sizeof sink, 0) > 0) {
    }
    close(fd);
    return NULL;
}

/* A listener on a free loopback port whose one connection `serve` plays (given &*lfd). */
static pthread_t start_fake(void *(*serve)(void *), int *lfd, int *port) {
    *lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    CHECK(bind(*lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(*lfd, 4) == 0 &&
          getsockname(*lfd, (struct sockaddr *)&a, &len) == 0);
    *port = ntohs(a.sin_port);
    pthread_t t;
    pthread_create(&t, NULL, serve, lfd);
    return t;
}

static void test_fake_store(void) {
    int lfd, port;
    pthread_t t = start_fake(fake_store, &lfd, &port);
    mt_store *c = NULL;
    CHECK_ERR(join(port, TOKEN, 5, &c), MT_ERR_MISMATCH,
              "did not prove that it knows this job's store token");
    CHECK(c == NULL);
    pthread_join(t, NULL);
    close(lfd);
}

/* A peer on the store's port that answers HELLO with a length prefix of 100 MiB: the client
 * refuses it at once, before allocating it or waiting for its bytes (it has not proven it is the
 * store). */
static void *huge_answer_store(void *arg) {
    int lfd = *(int *)arg;
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) return NULL;
    unsigned char in[1024];
    if (recv(fd, in, sizeof in, 0) > 0) raw_send(fd, "\x06\x40\x00\x00\x00", 5);
    unsigned char sink[64];
    while (recv(fd, sink, sizeof sink, 0) > 0) {
    }
    close(fd);
    return NULL;
}

static void test_fake_store_huge_answer(void) {
    int lfd, port;
    pthread_t t = start_fake(huge_answer_store, &lfd, &port);
    mt_store *c = NULL;
    double t0 = mt_clock_now_s();
    CHECK_ERR(join(port, TOKEN, 5, &c), MT_ERR_PROTOCOL, "104857600 bytes",
              "proven it knows the token");
    CHECK_MSG(mt_clock_now_s() - t0 < 2, "took %g s", mt_clock_now_s() - t0);
    CHECK(c == NULL);
    pthread_join(t, NULL);
    close(lfd);
}

/* ---- bounds -------------------------------------------------------------------------------- */

/* A length prefix over 1 KiB before authenticating closes the connection at once (before its
 * body is sent): the server never waits for, or buffers, a stranger's large frame. */
static void test_preauth_frame_limit(void) {
    mt_store_server *server = start(TOKEN, 0, 0);
    if (!server) return;
    int port = mt_store_server_port(server);
    int fd = raw_connect(port);
    CHECK(raw_send(fd, "\0\0\x04\x01", 4)); /* 1025 bytes announced, none sent */
    double t0 = mt_clock_now_s();
    CHECK_MSG(raw_closed_within(fd, 3000), "a 1025-byte pre-auth frame was not refused");
    CHECK(mt_clock_now_s() - t0 < 2);
    close(fd);
    /* The same length is fine once authenticated (a value of 1 KiB). */
    mt_store *good = NULL;
    CHECK_OK(join(port, TOKEN, 5, &good));
    char value[1100];
    memset(value, 'v', sizeof value);
    if (good) CHECK_OK(mt_store_set(good, "big", value, sizeof value));
    mt_store_server_stats st;
    mt_store_server_get_stats(server, &st);
    CHECK_MSG(st.refused >= 1, "refused %llu", (unsigned long long)st.refused);
    mt_store_close(good);
    mt_store_server_stop(server);
}

/* At the client limit a connection that has not authenticated gives way to a new one; when every
 * connection is authenticated, a new client is told the store is busy. */
static void test_client_limit(void) {
    mt_store_server *server = start(TOKEN, 3, 0);
    if (!server) return;
    int port = mt_store_server_port(server);
    mt_store *c[3] = {NULL, NULL, NULL};
    CHECK_OK(join(port, TOKEN, 5, &c[0]));
    CHECK_OK(join(port, TOKEN, 5, &c[1]));
    int idle = raw_connect(port); /* a stranger holding the third slot */
    for (int i = 0; i < 100 && mt_store_server_clients(server) < 3; i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    CHECK_OK(join(port, TOKEN, 5, &c[2]));
    CHECK_MSG(raw_closed_within(idle, 3000), "the unauthenticated connection was not evicted");
    close(idle);
    mt_store *fourth = NULL;
    CHECK_ERR(join(port, TOKEN, 1, &fourth), MT_ERR_TIMEOUT, "client limit",
              "MT_STORE_MAX_CLIENTS");
    CHECK(fourth == NULL);
    mt_store_server_stats st;
    if (c[0]) CHECK_OK(mt_store_stats(c[0], &st));
    CHECK_MSG(st.max_clients == 3 && st.clients <= 3 && st.busy >= 1,
              "max %u clients %u busy %llu", st.max_clients, st.clients,
              (unsigned long long)st.busy);
    /* One leaves: there is room again. */
    mt_store_close(c[2]);
    c[2] = NULL;
    CHECK_OK(join(port, TOKEN, 5, &c[2]));
    for (int i = 0; i < 3; i++) mt_store_close(c[i]);
    mt_store_server_stop(server);
}

/* Opens silent connections every 20 ms until told to stop (a flood at the client limit). */
typedef struct flood {
    int port;
    atomic_bool stop;
    int fds[512];
    int n;
} flood;

static void *flood_main(void *arg) {
    flood *f = arg;
    while (!atomic_load(&f->stop) && f->n < (int)(sizeof f->fds / sizeof *f->fds)) {
        f->fds[f->n++] = raw_connect(f->port);
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* At the client limit, during a flood of silent connections: a connection between HELLO and
 * AUTH is not evicted for a newcomer (it was, as the oldest unauthenticated one), and a new client
 * of the job connects. */
static void test_flood_spares_handshake(void) {
    mt_store_server *server = start(TOKEN, 8, 0);
    if (!server) return;
    int port = mt_store_server_port(server);
    int mid = raw_connect(port);
    mt_store_buf b = {0};
    unsigned char got[64];
    send_hello(mid, &b, got);
    mt_store_buf_free(&b);
    static flood f;
    f.port = port;
    atomic_init(&f.stop, false);
    pthread_t t;
    pthread_create(&t, NULL, flood_main, &f);
    /* 0.3 s: the flood fills the 7 other slots within 0.15 s and keeps arriving. */
    CHECK_MSG(!raw_closed_within(mid, 300), "a connection between HELLO and AUTH was evicted for "
              "a silent newcomer");
    mt_store *job = NULL;
    CHECK_OK(join(port, TOKEN, 5, &job));
    if (job) CHECK_OK(mt_store_set(job, "joined", "during the flood", 16));
    atomic_store(&f.stop, true);
    pthread_join(t, NULL);
    mt_store_server_stats st;
    mt_store_server_get_stats(server, &st);
    CHECK_MSG(st.clients_peak <= 8, "clients peak %u over the limit of 8", st.clients_peak);
    /* The flood went past the limit: some of it was evicted or turned away. */
    CHECK_MSG(f.n > 8 && st.refused + st.busy >= (uint64_t)(f.n - 8), "flood %d refused %llu "
              "busy %llu", f.n,
              (unsigned long long)st.refused, (unsigned long long)st.busy);
    for (int i = 0; i < f.n; i++)
        if (f.fds[i] >= 0) close(f.fds[i]);
    close(mid);
    mt_store_close(job);
    mt_store_server_stop(server);
}

/* Keys and values beyond MT_STORE_MAX_BYTES are refused to that client, which stays connected;
 * replacing a value by a smaller one is always allowed. */
static void test_byte_limit(void) {
    const uint64_t cap = 1u << 20;
    mt_store_server *server = start(TOKEN, 0, cap);
    if (!server) return;
    mt_store *c = NULL;
    CHECK_OK(join(mt_store_server_port(server), TOKEN, 5, &c));
    if (!c) {
        mt_store_server_stop(server);
        return;
    }
    size_t big = 600 << 10;
    char *value = calloc(1, big);
    CHECK_OK(mt_store_set(c, "first", value, big));
    CHECK_ERR(mt_store_set(c, "second", value, big), MT_ERR_INVALID_ARG, "the store is full",
              "'second'", "MT_STORE_MAX_BYTES=1048576");
    int64_t r = 0;
    CHECK_OK(mt_store_add(c, "counter", 1, &r)); /* small writes still fit */
    CHECK_OK(mt_store_set(c, "first", "x", 1));  /* shrinking frees room */
    CHECK_OK(mt_store_set(c, "second", value, big));
    free(value);
    mt_store_server_stats st;
    CHECK_OK(mt_store_stats(c, &st));
    CHECK_MSG(st.kv_peak <= cap && st.kv_bytes <= cap && st.kv_bytes > big,
              "kv %llu peak %llu", (unsigned long long)st.kv_bytes,
              (unsigned long long)st.kv_peak);
    CHECK(st.max_bytes == cap);
    mt_store_close(c);
    mt_store_server_stop(server);
}

/* MT_STORE_* numbers outside their range stop the server from starting, naming the variable. */
static void test_env_ranges(void) {
    mt_store_server *s = NULL;
    int listen_err;
    mt_store_server_opts o = {.bind_addr = "127.0.0.1", .job_id = JOB, .token = TOKEN};
    const char *bad[][2] = {{"MT_STORE_MAX_CLIENTS", "0"},       {"MT_STORE_MAX_CLIENTS", "x"},
                            {"MT_STORE_MAX_CLIENTS", "-3"},      {"MT_STORE_MAX_CLIENTS", "2000000"},
                            {"MT_STORE_MAX_BYTES", "5"},         {"MT_STORE_MAX_BYTES", "1e9"},
                            {"MT_STORE_MAX_BYTES", "99999999999999999999"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv(bad[i][0], bad[i][1], 1);
        char want[96];
        snprintf(want, sizeof want, "%s=%s is not %s", bad[i][0], bad[i][1],
                 strcmp(bad[i][0], "MT_STORE_MAX_BYTES") ? "an integer in 1..1000000"
                                                         : "a byte count in 1048576..");
        CHECK_ERR(mt_store_server_start_opts(&o, &s, &listen_err), MT_ERR_INVALID_ARG, want);
        CHECK(s == NULL);
        unsetenv(bad[i][0]);
    }
    setenv("MT_STORE_MAX_CLIENTS", "7", 1);
    o.max_clients = 100; /* the variable wins over the caller's default */
    CHECK_OK(mt_store_server_start_opts(&o, &s, &listen_err));
    unsetenv("MT_STORE_MAX_CLIENTS");
    mt_store_server_stats st;
    if (s) mt_store_server_get_stats(s, &st);
    CHECK(s && st.max_clients == 7);
    mt_store_server_stop(s);
    o.token = "short";
    CHECK_ERR(mt_store_server_start_opts(&o, &s, &listen_err), MT_ERR_INVALID_ARG,
              "store token is 5 bytes long");
}

/* A token file must be the owner's alone. */
static void test_token_file(void) {
    char path[] = "/tmp/mt_token_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK(write(fd, TOKEN "\n", strlen(TOKEN) + 1) == (ssize_t)strlen(TOKEN) + 1);
    close(fd);
    char text[MT_STORE_TOKEN_MAX + 2];
    CHECK_OK(mt_store_token_read_file(path, text, sizeof text));
    CHECK(strcmp(text, TOKEN) == 0);
    /* Another user's file, even of mode 0600, is refused (only root can make one here). */
    if (chown(path, geteuid() + 1, (gid_t)-1) == 0) {
        CHECK_ERR(mt_store_token_read_file(path, text, sizeof text), MT_ERR_INVALID_ARG, path,
                  "is owned by uid", "not by this process's user");
        CHECK(chown(path, geteuid(), (gid_t)-1) == 0);
    } else {
        printf("test_store_auth: not root, the token file owner check is not exercised\n");
    }
    chmod(path, 0644);
    CHECK_ERR(mt_store_token_read_file(path, text, sizeof text), MT_ERR_INVALID_ARG, path,
              "mode 0644", "chmod 600");
    unlink(path);
    CHECK_ERR(mt_store_token_read_file(path, text, sizeof text), MT_ERR_IO, path);
}

/* Many strangers at once, each announcing a frame at the pre-auth limit and sending garbage:
 * every one is closed, the server's buffers stay within connections x 1 KiB, a client of the
 * job is served throughout. */
static void test_abuse_memory(void) {
    enum { CROWD = 200 };
    mt_store_server *server = start(TOKEN, CROWD + 8, 0);
    if (!server) return;
    int port = mt_store_server_port(server);
    mt_store *good = NULL;
    CHECK_OK(join(port, TOKEN, 5, &good));
    int fds[CROWD];
    unsigned char garbage[1024 + 4];
    memset(garbage, 0xa5, sizeof garbage);
    garbage[0] = 0;
    garbage[1] = 0;
    garbage[2] = 4;
    garbage[3] = 0; /* 1024: the largest frame a stranger may announce */
    for (int i = 0; i < CROWD; i++) {
        fds[i] = raw_connect(port);
        if (fds[i] >= 0) raw_send(fds[i], garbage, i % 2 ? sizeof garbage : 600);
    }
    if (good) CHECK_OK(mt_store_set(good, "during", "abuse", 5));
    int closed = 0;
    for (int i = 0; i < CROWD; i++) {
        /* Half sent a whole garbage frame (refused at once), half a partial one that the
         * handshake deadline of test_main (1 s) ends. */
        if (fds[i] >= 0 && raw_closed_within(fds[i], 5000)) closed++;
        if (fds[i] >= 0) close(fds[i]);
    }
    CHECK_MSG(closed == CROWD, "%d of %d abusive connections closed", closed, CROWD);
    mt_store_server_stats st;
    if (good) CHECK_OK(mt_store_stats(good, &st));
    printf("test_store_auth: %d abusive connections: buffered peak %llu bytes, kv peak %llu, "
           "total peak %llu, %llu refused\n", CROWD, (unsigned long long)st.buffered_peak,
           (unsigned long long)st.kv_peak, (unsigned long long)st.total_peak,
           (unsigned long long)st.refused);
    CHECK_MSG(st.buffered_peak <= (uint64_t)(CROWD + 1) * 2048, "buffered peak %llu",
              (unsigned long long)st.buffered_peak);
    CHECK(st.refused >= CROWD);
    mt_store_close(good);
    mt_store_server_stop(server);
}

int main(void) {
    unsetenv("MT_STORE_TOKEN");
    setenv("MT_STORE_HANDSHAKE_TIMEOUT_S", "1", 1);
    test_tokens();
    test_stranger_learns_nothing();
    test_fake_store();
    test_fake_store_huge_answer();
    test_preauth_frame_limit();
    test_client_limit();
    test_flood_spares_handshake();
    test_byte_limit();
    test_env_ranges();
    test_token_file();
    test_abuse_memory();
    return check_report("test_store_auth");
}
