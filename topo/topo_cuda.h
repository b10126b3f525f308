/* Internal: numbering live GPUs by their CUDA index. hwloc finds every NVIDIA PCI device; a
 * process sees those CUDA_VISIBLE_DEVICES lets through, numbered in CUDA_DEVICE_ORDER. The CUDA
 * runtime, where present, says this outright (bus id per index); otherwise the numbering is
 * worked out from the two variables as CUDA reads them. */
#ifndef MT_TOPO_TOPO_CUDA_H
#define MT_TOPO_TOPO_CUDA_H

#include "topo/topo_nvml.h"
#include "topo/topology.h"

#include <stddef.h>

/* What decides the numbering; a pure description, so that every case can be tested. */
typedef struct mt_topo_cuda_view {
    const char *visible_devices; /* CUDA_VISIBLE_DEVICES; NULL when unset (all visible) */
    const char *device_order;    /* CUDA_DEVICE_ORDER; NULL when unset (FASTEST_FIRST) */
    /* The GPUs the driver exposes (from NVML): they, not hwloc's PCI devices, are what CUDA
     * ordinals count, and their UUIDs resolve "GPU-..." entries. NULL when NVML is not loaded. */
    const mt_nvml_gpu *driver;
    size_t n_driver;
    /* The bus id of each CUDA index as the CUDA runtime reports it (any case, 4- or 8-digit
     * domain); NULL when there is no runtime answer. When given, it alone decides. */
    const char *const *runtime_busids;
    size_t n_runtime;
} mt_topo_cuda_view;

/* Gives every GPU of t its CUDA index and drops the GPUs this process cannot see (one info line
 * each), then sorts gpus[] by index. Without a runtime answer: ordinals count the driver's GPUs
 * (else t's) in PCI bus order, which is CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID and the
 * best available guess under FASTEST_FIRST (said in a debug line); CUDA_VISIBLE_DEVICES is read
 * as CUDA does: comma-separated ordinals or GPU-<uuid prefix> entries, the list ending at the
 * first invalid entry, a repeated device hiding every GPU, "" hiding all. An entry that cannot
 * be resolved here (a UUID without NVML, a MIG instance) gives MT_ERR_UNSUPPORTED and leaves t
 * unchanged. */
mt_status mt_topo_cuda_number(mt_topo *t, const mt_topo_cuda_view *view);

/* The live numbering: the environment, the CUDA runtime when built with it and a device is
 * present (else quietly without), and the driver's GPUs from NVML (driver may be NULL). Where
 * CUDA_VISIBLE_DEVICES cannot be resolved it warns and keeps bus order with every GPU. */
mt_status mt_topo_cuda_number_live(mt_topo *t, const mt_nvml_gpu *driver, size_t n_driver);

#endif
