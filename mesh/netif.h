/* Internal: MT_SOCKET_IFNAME, the network interface that cross-host traffic should use. */
#ifndef MT_MESH_NETIF_H
#define MT_MESH_NETIF_H

#include <meshtrain/status.h>

#include <stddef.h>

/* Writes the first IPv4 address of interface ifname (its first IPv6 one when it has no IPv4)
 * as text into out. An unknown interface or one without an address is an error that lists the
 * interfaces that do have one. */
mt_status mt_netif_address(const char *ifname, char *out, size_t cap);

/* Where a rendezvous store should listen: with MT_SOCKET_IFNAME set, that interface's address
 * (written into buf, *bind_addr = buf); otherwise *bind_addr = NULL, every interface. */
mt_status mt_netif_store_bind(char *buf, size_t cap, const char **bind_addr);

#endif
