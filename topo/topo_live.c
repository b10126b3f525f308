/* Live discovery of this machine through hwloc, through the same object walk as hwloc XML files
 * (topo/topo_hwloc.c), so that `lstopo --of xml` of a host and the host itself give one model. */
#include "core/error.h"
#include "topo/topo_hwloc.h"

mt_status mt_topo_discover(mt_topo **out) {
    *out = NULL;
    hwloc_topology_t h;
    if (hwloc_topology_init(&h) != 0)
        return mt_error(MT_ERR_SYSTEM, "live topology: hwloc cannot initialize");
    mt_status s = MT_OK;
    /* All I/O objects: the PCI tree with its bridges decides PIX/PXB/PHB, and NICs and GPUs are
     * recognised from PCI devices and their OS devices. */
    if (hwloc_topology_set_io_types_filter(h, HWLOC_TYPE_FILTER_KEEP_ALL) != 0 ||
        hwloc_topology_load(h) != 0)
        s = mt_error(MT_ERR_SYSTEM, "live topology: hwloc cannot discover this machine");
    if (s == MT_OK) s = mt_topo_from_hwloc(h, "live", "live topology", out);
    hwloc_topology_destroy(h);
    return s;
}
