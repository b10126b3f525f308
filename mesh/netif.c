/* MT_SOCKET_IFNAME: the store listens on the chosen interface only, so that a host with several
 * networks does not offer the rendezvous on one the other nodes cannot reach. (UCX is pointed at
 * the same interface through UCX_NET_DEVICES by runtime.c.) */
#include "mesh/netif.h"

#include "core/error.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
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

mt_status mt_netif_store_bind(char *buf, size_t cap, const char **bind_addr) {
    const char *ifname = getenv("MT_SOCKET_IFNAME");
    *bind_addr = NULL;
    if (!ifname || !*ifname) return MT_OK;
    MT_TRY(mt_netif_address(ifname, buf, cap));
    *bind_addr = buf;
    return MT_OK;
}
