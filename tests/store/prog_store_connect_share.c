/* Run by store_connect_share.sh inside a user, mount and network namespace where the name
 * "twoaddr" resolves to two loopback addresses: starts a store on every address, drops (nftables,
 * no reset) the packets to the first address the resolver returns, and connects to "twoaddr"
 * with a 4 s deadline. The first address must get only its share (2 s) so that the second one
 * connects: before, the first ate the whole deadline and the connection failed. */
#include "check.h"

#include "core/clock.h"

#include <meshtrain/store.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

int main(void) {
    mt_store_server *server = NULL;
    /* every address, explicitly: both of "twoaddr" must reach it */
    CHECK_OK(mt_store_server_start("0.0.0.0", 0, "share", &server));
    if (!server) return check_report("prog_store_connect_share");
    int port = mt_store_server_port(server);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    CHECK(getaddrinfo("twoaddr", NULL, &hints, &res) == 0 && res && res->ai_next);
    if (!res || !res->ai_next) return check_report("prog_store_connect_share");
    char first[INET6_ADDRSTRLEN] = "?";
    getnameinfo(res->ai_addr, res->ai_addrlen, first, sizeof first, NULL, 0, NI_NUMERICHOST);
    freeaddrinfo(res);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "nft add rule inet cut out ip daddr %s tcp dport %d drop", first,
             port);
    CHECK(system(cmd) == 0);
    double t0 = mt_clock_now_s();
    mt_store *c = NULL;
    mt_status st = mt_store_connect("twoaddr", port, "share", 4.0, &c);
    double took = mt_clock_now_s() - t0;
    printf("first address %s dropped: connected after %.2f s\n", first, took);
    CHECK_MSG(st == MT_OK, "%s", mt_last_error());
    CHECK_MSG(took >= 1.8 && took < 3.9, "took %.2f s (its share of 4 s is 2 s)", took);
    mt_store_close(c);
    mt_store_server_stop(server);
    return check_report("prog_store_connect_share");
}
