/* "Is the endpoint mine" compares resolved addresses rather than names: the endpoint may be given
 * as a name, as one of several addresses of this machine, or as a loopback address when every
 * node runs on one machine (tests, a single host split into several nodes). */
#include "endpoint.h"

#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

int mtrun_endpoint_parse(const char *text, char *host, size_t cap, int *port) {
    const char *h = text, *rest;
    size_t hlen;
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (!close) return -1;
        h = text + 1;
        hlen = (size_t)(close - h);
        rest = close + 1;
        if (*rest && *rest != ':') return -1;
    } else {
        const char *colon = strchr(text, ':');
        /* A bare IPv6 address (several colons) has no port part. */
        if (colon && strchr(colon + 1, ':')) colon = NULL;
        hlen = colon ? (size_t)(colon - text) : strlen(text);
        rest = text + hlen;
    }
    if (hlen == 0 || hlen >= cap) return -1;
    if (*rest == ':') {
        char *end;
        errno = 0;
        long p = strtol(rest + 1, &end, 10);
        if (!rest[1] || *end || errno || p < 1 || p > 65535) return -1;
        *port = (int)p;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    return 0;
}

static bool same_addr(const struct sockaddr *a, const struct sockaddr *b) {
    if (!a || !b || a->sa_family != b->sa_family) return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return false;
}

static bool is_loopback(const struct sockaddr *a) {
    if (a->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->sa_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);
    return false;
}

static struct addrinfo *resolve(const char *host) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) return NULL;
    return res;
}

bool mtrun_endpoint_is_local(const char *host, const char *local_addr) {
    if (local_addr && strcmp(host, local_addr) == 0) return true;
    struct addrinfo *res = resolve(host);
    if (!res) return false;
    bool mine = false;
    if (local_addr) {
        struct addrinfo *own = resolve(local_addr);
        for (struct addrinfo *a = res; a && !mine; a = a->ai_next)
            for (struct addrinfo *b = own; b && !mine; b = b->ai_next)
                mine = same_addr(a->ai_addr, b->ai_addr);
        if (own) freeaddrinfo(own);
        freeaddrinfo(res);
        return mine;
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) ifs = NULL;
    for (struct addrinfo *a = res; a && !mine; a = a->ai_next) {
        mine = is_loopback(a->ai_addr);
        for (struct ifaddrs *i = ifs; i && !mine; i = i->ifa_next)
            mine = same_addr(a->ai_addr, i->ifa_addr);
    }
    if (ifs) freeifaddrs(ifs);
    freeaddrinfo(res);
    return mine;
}
