/* Internal: the machine a runtime runs on, as the topology model (topo/topology.h). Loaded on
 * first use, not by mt_init: most programs never ask, and discovery walks the whole PCI tree.
 * MT_TOPO_FILE, when set, replaces live discovery (topo/topo_open.h), as it does for mtrun. */
#ifndef MT_MESH_RUNTIME_TOPO_H
#define MT_MESH_RUNTIME_TOPO_H

#include "topo/topology.h"

#include <meshtrain/runtime.h>

/* The runtime's topology, loaded on the first call and owned by the runtime (valid until
 * mt_finalize). A failure names MT_TOPO_FILE and the file, or live discovery, and is retried on
 * the next call. Not thread-safe: call it from the thread that called mt_init. */
mt_status mt_runtime_topology(mt_runtime *rt, const mt_topo **out);

#endif
