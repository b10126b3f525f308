/* mtrun's part of the store's security (docs/security.md): the job's store token, the address
 * the store listens on, and the open-file limit the store needs. */
#ifndef MTRUN_SECURITY_H
#define MTRUN_SECURITY_H

#include "options.h"

/* Settles the store token before any thread exists: --rdzv_conf token_file (mode 0600), else
 * MT_STORE_TOKEN, else a fresh random one for a single-node job; multi-node without one warns
 * that the store is open. The token ends up in MT_STORE_TOKEN, which this mtrun's own store
 * connections and its ranks (through their environment) read. Also raises RLIMIT_NOFILE to its
 * hard limit, and refuses when a hosted store would need more. Returns -1 to go on, else the
 * exit code after saying why. */
int mtrun_security_prepare(const mtrun_options *o);

/* Where the hosted store listens (o->store_listen) and this node's mtrun and ranks reach it
 * (o->store_bind): 127.0.0.1 for a single node, MT_SOCKET_IFNAME's address, or the address that
 * reaches the rendezvous endpoint (mt_netif_store_bind). Returns -1, or 2 after saying why. */
int mtrun_security_store_bind(mtrun_options *o);

/* The client limit of a store hosted for this job. */
int mtrun_security_max_clients(const mtrun_options *o);

#endif
