/* Internal: the one walk over an hwloc topology that both the hwloc XML loader and live discovery
 * use, so that a file and the machine it was taken from give the same model. */
#ifndef MT_TOPO_TOPO_HWLOC_H
#define MT_TOPO_TOPO_HWLOC_H

#include "topo/topology.h"

#include <hwloc.h>

/* Builds a model from a loaded hwloc topology (I/O objects kept). source becomes topo->source;
 * what names the input in error messages ("topology file x.xml", "live topology"). */
mt_status mt_topo_from_hwloc(hwloc_topology_t h, const char *source, const char *what,
                             mt_topo **out);

#endif
