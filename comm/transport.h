/* Internal: the UCX transport of a process, created by mt_init once the store is joined.
 *
 * It owns the UCX context and worker, the endpoints to every rank (addresses exchanged through
 * the rendezvous store) and the communication progress thread that runs queued group operations.
 * runtime.c creates and destroys it; comm code reaches it through mt_runtime_transport. The
 * object itself is defined in comm/host/ucx.h.
 */
#ifndef MT_COMM_TRANSPORT_H
#define MT_COMM_TRANSPORT_H

#include <meshtrain/comm.h>
#include <meshtrain/runtime.h>

typedef struct mt_transport mt_transport;

/* Creates the UCX context/worker, publishes this rank's worker address in the store, connects to
 * every rank of the job and starts the progress thread. Collective over all ranks. */
mt_status mt_transport_create(mt_runtime *rt, mt_transport **out);

/* Stops the progress thread (after outstanding work) and releases UCX resources. */
void mt_transport_destroy(mt_transport *transport);

/* Creates the group of all ranks on this transport (used by mt_init for mt_runtime_world). */
mt_status mt_transport_world_group(mt_runtime *rt, mt_transport *transport, mt_group **out);

/* The transport of a runtime (defined in runtime.c). */
mt_transport *mt_runtime_transport(mt_runtime *rt);

#endif
