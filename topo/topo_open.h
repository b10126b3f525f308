/* Internal: the topology a process should use, the one place that decides between a file given
 * through MT_TOPO_FILE and live discovery, so that mtrun and the runtime always agree. */
#ifndef MT_TOPO_TOPO_OPEN_H
#define MT_TOPO_TOPO_OPEN_H

#include "topo/topology.h"

/* The value of MT_TOPO_FILE, or NULL when it is unset or empty. */
const char *mt_topo_file_env(void);

/* Loads MT_TOPO_FILE when it is set (an error then names the variable and the file), else
 * discovers this machine (source "live"). Free the result with mt_topo_destroy. */
mt_status mt_topo_open(mt_topo **out);

#endif
