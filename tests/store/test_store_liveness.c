/* How the store notices a host that stopped answering: the keepalive and TCP_USER_TIMEOUT
 * settings derived from MT_TIMEOUT_S (store/keepalive.c) as the kernel takes them, and the
 * client's answer waits against a server that is alive to its kernel but answers nothing (a
 * SIGSTOPped process): never longer than MT_TIMEOUT_S, or the connection's answer limit. */
#include "check.h"

#include "core/clock.h"
#include "store/keepalive.h"
#include "store/store_internal.h"

#include <meshtrain/store.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_settings(void) {
    mt_store_keepalive k;
    mt_store_keepalive_for(300, &k);
    CHECK(k.user_timeout_ms == 100000 && k.idle_s == 50 && k.interval_s == 25 && k.count == 3);
    mt_store_keepalive_for(6, &k);
    CHECK(k.user_timeout_ms == 2000 && k.idle_s == 1 && k.interval_s == 1 && k.count == 3);
    mt_store_keepalive_for(0.5, &k); /* floors: the kernel counts keepalive in whole seconds */
    CHECK(k.user_timeout_ms == 1000 && k.idle_s == 1 && k.interval_s == 1);
    mt_store_keepalive_for(1e8, &k); /* ceilings */
    CHECK(k.user_timeout_ms == 3600000 && k.idle_s == 3600 && k.interval_s == 600);
    /* Detection (idle + probes, bounded by the user timeout) stays well within the timeout. */
    for (double t = 3; t <= 3000; t *= 10) {
        mt_store_keepalive_for(t, &k);
        CHECK_MSG(k.user_timeout_ms / 1000.0 <= t / 2, "timeout %g", t);
        /* above the one-second floors, the probes too */
        if (t >= 30) CHECK_MSG(k.idle_s + k.count * k.interval_s <= t / 2, "timeout %g", t);
    }
}

/* A connected TCP socket (to a listener of this process) gets the settings. */
static void test_applied(void) {
    int l = socket(AF_INET, SOCK_STREAM, 0), c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 1) == 0);
    CHECK(getsockname(l, (struct sockaddr *)&a, &alen) == 0);
    CHECK(connect(c, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(mt_store_keepalive_apply(c, 60) == 0);
    int v = 0;
    unsigned u = 0;
    socklen_t n = sizeof v;
    CHECK(getsockopt(c, SOL_SOCKET, SO_KEEPALIVE, &v, &n) == 0 && v == 1);
    CHECK(getsockopt(c, IPPROTO_TCP, TCP_KEEPIDLE, &v, &n) == 0 && v == 10);
    CHECK(getsockopt(c, IPPROTO_TCP, TCP_KEEPINTVL, &v, &n) == 0 && v == 5);
    CHECK(getsockopt(c, IPPROTO_TCP, TCP_KEEPCNT, &v, &n) == 0 && v == 3);
    n = sizeof u;
    CHECK(getsockopt(c, IPPROTO_TCP, TCP_USER_TIMEOUT, &u, &n) == 0 && u == 20000);
    close(c);
    close(l);
}

/* A store server in a child process, which the test can stop: returns its pid, *port set. */
static pid_t server_child(int *port) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        mt_store_server *s = NULL;
        int got = -1;
        if (mt_store_server_start("127.0.0.1", 0, "live", &s) == MT_OK)
            got = mt_store_server_port(s);
        (void)!write(p[1], &got, sizeof got);
        for (;;) pause();
    }
    close(p[1]);
    *port = -1;
    if (read(p[0], port, sizeof *port) != (ssize_t)sizeof *port) *port = -1;
    close(p[0]);
    return pid;
}

static void test_silent_server(void) {
    int port;
    pid_t pid = server_child(&port);
    CHECK(pid > 0 && port > 0);
    if (pid <= 0 || port <= 0) return;
    setenv("MT_TIMEOUT_S", "1.5", 1);
    mt_store *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(mt_store_connect("127.0.0.1", port, "live", 10, &a));
    CHECK_OK(mt_store_connect("127.0.0.1", port, "live", 10, &b));
    CHECK_OK(mt_store_connect("127.0.0.1", port, "live", 10, &c));
    if (!a || !b || !c) goto out;
    CHECK_OK(mt_store_set(a, "k", "v", 1));
    kill(pid, SIGSTOP);
    int status = 0; /* stopped for sure, every thread of it, before the next request */
    CHECK(waitpid(pid, &status, WUNTRACED) == pid && WIFSTOPPED(status));
    /* The kernel still acknowledges: only the answer wait can tell. */
    CHECK_OK(mt_store_set_answer_limit(a, 0.4));
    double t0 = mt_clock_now_s();
    mt_status st = mt_store_set(a, "k", "w", 1);
    CHECK_MSG(st == MT_ERR_TIMEOUT, "%s", mt_last_error());
    double took = mt_clock_now_s() - t0;
    CHECK_MSG(took >= 0.35 && took < 2.0, "answer limit 0.4 s: waited %.2f s", took);
    CHECK(strstr(mt_last_error(), "did not answer within 0.4 s") != NULL);
    /* Without a limit: MT_TIMEOUT_S, no more. */
    t0 = mt_clock_now_s();
    int64_t ignored;
    CHECK(mt_store_add(b, "n", 1, &ignored) == MT_ERR_TIMEOUT);
    took = mt_clock_now_s() - t0;
    CHECK_MSG(took >= 1.4 && took < 3.5, "MT_TIMEOUT_S 1.5: waited %.2f s", took);
    /* A blocking get: the server's wait, plus at most MT_TIMEOUT_S (not 10 s) for the answer. */
    t0 = mt_clock_now_s();
    void *v = NULL;
    CHECK(mt_store_get(c, "never", 0.3, &v, NULL) == MT_ERR_TIMEOUT);
    took = mt_clock_now_s() - t0;
    CHECK_MSG(took >= 1.7 && took < 4.5, "get 0.3 s, MT_TIMEOUT_S 1.5: waited %.2f s", took);
    free(v);
out:
    mt_store_close(a);
    mt_store_close(b);
    mt_store_close(c);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    unsetenv("MT_TIMEOUT_S");
}

int main(void) {
    test_settings();
    test_applied();
    test_silent_server();
    return check_report("test_store_liveness");
}
