/* Where a job listens (mesh/netif.c, docs/security.md): loopback for a single host,
 * MT_SOCKET_IFNAME's address, the address that reaches the store's address, and every interface
 * only for a name this host maps to loopback (as /etc/hosts often maps the host's own name). */
#include "check.h"

#include "mesh/netif.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The first IPv4 address of an interface other than lo, or false. */
static bool external_v4(char *out, size_t cap) {
    struct ifaddrs *all = NULL, *ifa;
    bool found = false;
    if (getifaddrs(&all) != 0) return false;
    for (ifa = all; ifa && !found; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET) continue;
        const struct sockaddr_in *a = (const struct sockaddr_in *)ifa->ifa_addr;
        if ((ntohl(a->sin_addr.s_addr) >> 24) == 127) continue;
        found = inet_ntop(AF_INET, &a->sin_addr, out, (socklen_t)cap) != NULL;
    }
    freeifaddrs(all);
    return found;
}

/* Whether name resolves (first answer) to a loopback address. */
static bool resolves_to_loopback(const char *name) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(name, NULL, &hints, &res) != 0) return false;
    char text[64] = "";
    if (res->ai_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, text, sizeof text);
    else
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)res->ai_addr)->sin6_addr, text, sizeof text);
    freeaddrinfo(res);
    return mt_netif_is_loopback(text);
}

int main(void) {
    unsetenv("MT_SOCKET_IFNAME");
    unsetenv("MT_STORE_LISTEN");
    char listen_at[64], connect_to[64], name[64];

    CHECK(mt_netif_is_loopback("127.0.0.1") && mt_netif_is_loopback("127.0.1.1") &&
          mt_netif_is_loopback("::1") && mt_netif_is_loopback("localhost"));
    CHECK(!mt_netif_is_loopback("10.0.0.1") && !mt_netif_is_loopback("fd00::2") &&
          !mt_netif_is_loopback("node0"));

    /* A single host: loopback whatever the store's address says. */
    CHECK_OK(mt_netif_store_bind("10.1.2.3", true, listen_at, connect_to, sizeof listen_at));
    CHECK(strcmp(listen_at, "127.0.0.1") == 0 && strcmp(connect_to, "127.0.0.1") == 0);

    /* Several hosts, all on this machine through loopback. */
    CHECK_OK(mt_netif_store_bind("127.0.0.1", false, listen_at, connect_to, sizeof listen_at));
    CHECK(strcmp(listen_at, "127.0.0.1") == 0 && strcmp(connect_to, "127.0.0.1") == 0);

    /* MT_SOCKET_IFNAME wins, single host or not; an unknown one is an error listing the known. */
    setenv("MT_SOCKET_IFNAME", "lo", 1);
    CHECK_OK(mt_netif_store_bind("10.1.2.3", false, listen_at, connect_to, sizeof listen_at));
    CHECK(strcmp(listen_at, "127.0.0.1") == 0 && strcmp(connect_to, listen_at) == 0);
    setenv("MT_SOCKET_IFNAME", "nosuch0", 1);
    CHECK(mt_netif_store_bind("127.0.0.1", false, listen_at, connect_to, sizeof listen_at) ==
          MT_ERR_NOT_FOUND);
    CHECK(strstr(mt_last_error(), "MT_SOCKET_IFNAME=nosuch0") && strstr(mt_last_error(), "lo"));
    unsetenv("MT_SOCKET_IFNAME");

    /* MT_STORE_LISTEN overrides where the store listens: "*" every interface, else an address. */
    setenv("MT_STORE_LISTEN", "*", 1);
    CHECK_OK(mt_netif_store_bind("127.0.0.1", true, listen_at, connect_to, sizeof listen_at));
    CHECK(listen_at[0] == '\0' && strcmp(connect_to, "127.0.0.1") == 0);
    setenv("MT_STORE_LISTEN", "127.0.0.5", 1);
    CHECK_OK(mt_netif_store_bind("127.0.0.1", false, listen_at, connect_to, sizeof listen_at));
    CHECK(strcmp(listen_at, "127.0.0.5") == 0 && strcmp(connect_to, "127.0.0.5") == 0);
    unsetenv("MT_STORE_LISTEN");

    CHECK_OK(mt_netif_name_of("127.0.0.1", name, sizeof name));
    CHECK(strcmp(name, "lo") == 0);
    CHECK(mt_netif_name_of("203.0.113.77", name, sizeof name) == MT_ERR_NOT_FOUND);

    /* The store's address is one of this host's own: listen there, and nowhere else. */
    char ext[64];
    if (external_v4(ext, sizeof ext)) {
        CHECK_OK(mt_netif_store_bind(ext, false, listen_at, connect_to, sizeof listen_at));
        CHECK_MSG(strcmp(listen_at, ext) == 0 && strcmp(connect_to, ext) == 0,
                  "store at %s: listens on '%s', connects to '%s'", ext, listen_at, connect_to);
    } else {
        printf("test_netif: no interface besides lo with IPv4: that case is not checked here\n");
    }

    /* The host's own name mapped to loopback (/etc/hosts): every interface, connect locally. */
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    if (host[0] && resolves_to_loopback(host)) {
        CHECK_OK(mt_netif_store_bind(host, false, listen_at, connect_to, sizeof listen_at));
        CHECK_MSG(listen_at[0] == '\0' && mt_netif_is_loopback(connect_to),
                  "store at '%s' (loopback here): listens on '%s', connects to '%s'", host,
                  listen_at, connect_to);
    } else {
        printf("test_netif: this host's name does not resolve to loopback: that case is not "
               "checked here\n");
    }

    /* A name that does not resolve: an error that names it and the way out. */
    CHECK(mt_netif_store_bind("no-such-host.invalid", false, listen_at, connect_to,
                              sizeof listen_at) == MT_ERR_NOT_FOUND);
    CHECK(strstr(mt_last_error(), "no-such-host.invalid") &&
          strstr(mt_last_error(), "MT_SOCKET_IFNAME"));
    return check_report("test_netif");
}
