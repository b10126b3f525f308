/* Raw TCP connections to a store server on 127.0.0.1, for the store tests that play misbehaving
 * clients and strangers (test_store.c, test_store_auth.c). */
#ifndef MT_TESTS_STORE_RAW_H
#define MT_TESTS_STORE_RAW_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

static inline int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline bool raw_send(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0) return false;
        c += w;
        n -= (size_t)w;
    }
    return true;
}

/* Reads what the server sends until it closes the connection or ms pass; returns the number of
 * bytes kept in buf (at most cap; more are read and counted in *total when total is not NULL),
 * and *closed says whether the server closed. */
static inline size_t raw_read_until_closed(int fd, int ms, unsigned char *buf, size_t cap,
                                           size_t *total, bool *closed) {
    size_t kept = 0, all = 0;
    unsigned char scratch[4096];
    *closed = false;
    for (int waited = 0; waited < ms; waited += 10) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 10) <= 0) continue;
        ssize_t n = recv(fd, scratch, sizeof scratch, 0);
        if (n <= 0) {
            *closed = true;
            break;
        }
        for (ssize_t i = 0; i < n; i++)
            if (kept < cap) buf[kept++] = scratch[i];
        all += (size_t)n;
    }
    if (total) *total = all;
    return kept;
}

/* True when the server closes the connection within ms (any reply bytes are skipped). */
static inline bool raw_closed_within(int fd, int ms) {
    bool closed;
    raw_read_until_closed(fd, ms, NULL, 0, NULL, &closed);
    return closed;
}

#endif
