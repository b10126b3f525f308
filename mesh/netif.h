/* Internal: MT_SOCKET_IFNAME, the network interface that cross-host traffic should use. */
#ifndef MT_MESH_NETIF_H
#define MT_MESH_NETIF_H

#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

/* Writes the first IPv4 address of interface ifname (its first IPv6 one when it has no IPv4)
 * as text into out. An unknown interface or one without an address is an error that lists the
 * interfaces that do have one. */
mt_status mt_netif_address(const char *ifname, char *out, size_t cap);

/* The source address of this host's route to host (which local address other nodes reach it
 * by, when host is this host's own address), as text. */
mt_status mt_netif_route_source(const char *host, char *out, size_t cap);

/* The name of the interface that holds address addr (text, as mt_netif_address writes it). */
mt_status mt_netif_name_of(const char *addr, char *name, size_t cap);

/* Whether addr (text) is a loopback address (127.0.0.0/8, ::1) or "localhost". */
bool mt_netif_is_loopback(const char *addr);

/* Where a rendezvous store hosted here listens (listen_at) and where its own host connects to it
 * (connect_to): MT_SOCKET_IFNAME's address when set; else 127.0.0.1 for a single-host job; else
 * the address this host uses to reach store_host (the store's address as the other nodes know
 * it). Only when store_host names this host by a loopback address although it is not one (a name
 * /etc/hosts maps to 127.0.1.1) is listen_at "" (every interface), with a warning.
 * MT_STORE_LISTEN overrides where it listens: an address (connected to as well), or "*" for
 * every interface (connect_to stays what the rule gives). */
mt_status mt_netif_store_bind(const char *store_host, bool single_host, char *listen_at,
                              char *connect_to, size_t cap);

#endif
