/* The rendezvous endpoint (--rdzv-endpoint HOST[:PORT]) and whether it names this machine. */
#ifndef MTRUN_ENDPOINT_H
#define MTRUN_ENDPOINT_H

#include <stdbool.h>
#include <stddef.h>

/* Splits "HOST", "HOST:PORT", "[V6]" or "[V6]:PORT" into host (without brackets) and port;
 * *port is left alone when the text has none. Returns 0, or -1 for an empty host, a bad port or
 * unbalanced brackets. */
int mtrun_endpoint_parse(const char *text, char *host, size_t cap, int *port);

/* True when this node should host the store at `host`: with local_addr given, when host and
 * local_addr are the same text or resolve to a common address; otherwise when host resolves to a
 * loopback address or to an address of one of this machine's interfaces. A host that does not
 * resolve is not ours (the connection attempt then reports it). */
bool mtrun_endpoint_is_local(const char *host, const char *local_addr);

#endif
