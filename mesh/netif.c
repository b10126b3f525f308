/* Where a job listens (docs/security.md): a single-host job on loopback only; otherwise on
 * MT_SOCKET_IFNAME's address, or on the address this host uses to reach the store's address, so
 * that a host with several networks does not offer the rendezvous (or UCX) on one the other
 * nodes cannot reach, and never on every interface. runtime.c points UCX at the same interface
 * through UCX_NET_DEVICES. */
#include "mesh/netif.h"

#include "core/error.h"

#include <meshtrain/log.h>

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool format_address(const struct sockaddr *sa, char *out, size_t cap) {
    if (sa->sa_family == AF_INET)
        return inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out,
                         (socklen_t)cap) != NULL;
    if (sa->sa_family == AF_INET6)
        return inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out,
                         (socklen_t)cap) != NULL;
    return false;
}

/* Appends name to the comma-separated list in buf unless it is there already. */
static void list_add(char *buf, size_t cap, const char *name) {
    char copy[512];
    snprintf(copy, sizeof copy, "%s", buf);
    for (char *save = NULL, *tok = strtok_r(copy, ", ", &save); tok;
         tok = strtok_r(NULL, ", ", &save))
        if (strcmp(tok, name) == 0) return;
    size_t used = strlen(buf);
    snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", name);
}

mt_status mt_netif_address(const char *ifname, char *out, size_t cap) {
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0)
        return mt_error_errno(MT_ERR_SYSTEM, errno, "listing network interfaces for "
                              "MT_SOCKET_IFNAME=%s", ifname);
    bool found = false, found_v4 = false;
    char known[512] = "";
    for (struct ifaddrs *ifa = all; ifa; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr) continue;
        int family = ifa->ifa_addr->sa_family;
        if (family != AF_INET && family != AF_INET6) continue;
        list_add(known, sizeof known, ifa->ifa_name);
        if (strcmp(ifa->ifa_name, ifname) != 0 || found_v4) continue;
        /* IPv4 first: it is what MASTER_ADDR usually names. */
        if (family == AF_INET || !found) {
            found = format_address(ifa->ifa_addr, out, cap);
            found_v4 = found && family == AF_INET;
        }
    }
    freeifaddrs(all);
    if (!found)
        return mt_error(MT_ERR_NOT_FOUND, "MT_SOCKET_IFNAME=%s: no such interface with an IP "
                        "address (interfaces with one: %s)", ifname, known[0] ? known : "none");
    return MT_OK;
}

mt_status mt_netif_route_source(const char *host, char *out, size_t cap) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    int rc = getaddrinfo(host, "9", &hints, &res);
    if (rc != 0)
        return mt_error(MT_ERR_NOT_FOUND, "cannot resolve the store address '%s' to choose the "
                        "interface to listen on: %s (or set MT_SOCKET_IFNAME)", host,
                        gai_strerror(rc));
    int err = ENETUNREACH;
    bool found = false;
    for (struct addrinfo *ai = res; ai && !found; ai = ai->ai_next) {
        /* A UDP connect sends nothing: it only asks the kernel for the route and its source. */
        int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        struct sockaddr_storage src;
        socklen_t slen = sizeof src;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&src, &slen) == 0)
            found = format_address((struct sockaddr *)&src, out, cap);
        else
            err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    if (!found)
        return mt_error_errno(MT_ERR_NOT_FOUND, err, "no route from this host to the store "
                              "address '%s' (or set MT_SOCKET_IFNAME)", host);
    return MT_OK;
}

mt_status mt_netif_name_of(const char *addr, char *name, size_t cap) {
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0)
        return mt_error_errno(MT_ERR_SYSTEM, errno, "listing network interfaces");
    bool found = false;
    for (struct ifaddrs *ifa = all; ifa && !found; ifa = ifa->ifa_next) {
        char text[64];
        if (!ifa->ifa_addr || !format_address(ifa->ifa_addr, text, sizeof text)) continue;
        if (strcmp(text, addr) != 0) continue;
        snprintf(name, cap, "%s", ifa->ifa_name);
        found = true;
    }
    freeifaddrs(all);
    if (!found)
        return mt_error(MT_ERR_NOT_FOUND, "no network interface of this host has the address %s",
                        addr);
    return MT_OK;
}

bool mt_netif_is_loopback(const char *addr) {
    struct in_addr v4;
    struct in6_addr v6;
    if (inet_pton(AF_INET, addr, &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, addr, &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
    return strcmp(addr, "localhost") == 0;
}

static mt_status store_rule(const char *store_host, bool single_host, char *listen_at,
                                     char *connect_to, size_t cap);

/* MT_STORE_LISTEN: an explicit listening address, "*" for every interface; the host still
 * connects where the rule says (connect_to is left as it is, or set to the address given). */
static void apply_listen_override(char *listen_at, char *connect_to, size_t cap) {
    const char *env = getenv("MT_STORE_LISTEN");
    if (!env || !*env) return;
    if (strcmp(env, "*") == 0) {
        listen_at[0] = '\0';
        return;
    }
    snprintf(listen_at, cap, "%s", env);
    snprintf(connect_to, cap, "%s", env);
}

mt_status mt_netif_store_bind(const char *store_host, bool single_host, char *listen_at,
                              char *connect_to, size_t cap) {
    mt_status st = store_rule(store_host, single_host, listen_at, connect_to, cap);
    if (st == MT_OK) apply_listen_override(listen_at, connect_to, cap);
    return st;
}

static mt_status store_rule(const char *store_host, bool single_host, char *listen_at,
                                     char *connect_to, size_t cap) {
    const char *ifname = getenv("MT_SOCKET_IFNAME");
    if (ifname && *ifname) {
        MT_TRY(mt_netif_address(ifname, listen_at, cap));
    } else if (single_host) {
        snprintf(listen_at, cap, "127.0.0.1");
    } else {
        MT_TRY(mt_netif_route_source(store_host, listen_at, cap));
        if (mt_netif_is_loopback(listen_at) && !mt_netif_is_loopback(store_host)) {
            /* A host name that /etc/hosts maps to 127.0.1.1 on its own host (Debian's habit):
             * the other nodes reach it elsewhere, at an address this host cannot tell. */
            mt_log(MT_LOG_WARN, "the store address '%s' is a loopback address (%s) on this host, "
                   "but other nodes reach it elsewhere: the store listens on every interface; set "
                   "MT_SOCKET_IFNAME to listen on one (docs/security.md)", store_host, listen_at);
            snprintf(connect_to, cap, "%s", listen_at);
            listen_at[0] = '\0';
            return MT_OK;
        }
    }
    snprintf(connect_to, cap, "%s", listen_at);
    return MT_OK;
}
