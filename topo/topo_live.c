/* Live discovery of this machine: hwloc, through the same object walk as hwloc XML files
 * (topo/topo_hwloc.c), so that `lstopo --of xml` of a host and the host itself give one model;
 * then, only where hwloc found NVIDIA GPUs, their CUDA numbering (topo/topo_cuda.c) and their
 * NVLinks from NVML (topo/topo_nvml.c). A machine without GPUs never loads NVML or CUDA. */
#include "core/error.h"
#include "topo/topo_cuda.h"
#include "topo/topo_hwloc.h"
#include "topo/topo_nvml.h"

#include <meshtrain/log.h>

#include <stdlib.h>

static mt_status load_hwloc(mt_topo **out) {
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

/* CUDA numbering first (it drops GPUs this process cannot see), then NVML's links, which replace
 * any hwloc's own NVML backend put in its matrix. */
static mt_status add_gpu_facts(mt_topo *t) {
    mt_nvml *nvml = NULL;
    char why[512];
    mt_status s = mt_nvml_open(&nvml, why, sizeof(why));
    if (s == MT_ERR_OUT_OF_MEMORY) return s;
    if (s != MT_OK) mt_log(MT_LOG_DEBUG, "live topology: NVML not used: %s", why);
    mt_nvml_gpu *driver = NULL;
    size_t n_driver = 0;
    if (nvml && mt_nvml_list_gpus(nvml, &driver, &n_driver) != MT_OK) {
        mt_log(MT_LOG_DEBUG, "live topology: %s", mt_last_error());
        driver = NULL; /* number from hwloc's GPUs alone */
    }
    s = mt_topo_cuda_number_live(t, driver, n_driver);
    free(driver);
    if (s == MT_OK) s = nvml ? mt_nvml_probe_links(nvml, t) : mt_nvml_note_failure(t, why);
    mt_nvml_close(nvml);
    return s;
}

mt_status mt_topo_discover(mt_topo **out) {
    *out = NULL;
    mt_topo *t = NULL;
    MT_TRY(load_hwloc(&t));
    mt_status s = t->n_gpus > 0 ? add_gpu_facts(t) : MT_OK;
    if (s != MT_OK) {
        mt_topo_destroy(t);
        return s;
    }
    *out = t;
    return MT_OK;
}
