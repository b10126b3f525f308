/* Internal: NVLink counts from hwloc's "NVLinkBandwidth" distances. hwloc's NVML backend writes,
 * for every active NVLink of a GPU, a fixed bandwidth per link into the matrix (summed over the
 * links joining the same two objects); dividing by that per-link figure gives the link count.
 * The figure depends on the NVLink generation, which the matrix does not record, so it is
 * derived from the GPU's model name. */
#ifndef MT_TOPO_NVLINK_RATE_H
#define MT_TOPO_NVLINK_RATE_H

#include "topo/topology.h"

#include <stdint.h>

/* The most links one matrix entry may stand for: NVML knows at most 36 links per GPU. More is
 * taken as a corrupt value, not as links. */
#define MT_TOPO_NVLINK_ENTRY_MAX 64

/* The MB/s per link that hwloc writes for the NVLink generation of a GPU model ("Tesla
 * P100-SXM2-16GB", "NVIDIA H100 80GB HBM3", "GA100 [A100 SXM4 40GB]"); 0 for a model this table
 * does not know. *generation (may be NULL) gets the NVLink generation, 0 when unknown. */
uint64_t mt_topo_nvlink_rate(const char *gpu_name, int *generation);

/* Turns t->nvlink_bw into NVLinks of each GPU it lists: a GPU column gives kind GPU, an NVSwitch
 * (t->switches) SWITCH, anything else (a CPU package on POWER) OTHER. Each listed GPU becomes
 * nvlink_known unless its model is unknown or an entry is absurd (one warning each, and
 * t->nvlink_note says so); a value that is not a whole number of links is rounded to the
 * nearest (one warning per call). Call after mt_topo_finish. Fails only for lack of memory. */
mt_status mt_topo_links_from_nvlink_bw(mt_topo *t);

#endif
