/* Internal: classification of a loaded topology (topo/topology.h) the way `nvidia-smi topo -m`
 * reports it: the connection code of every GPU/NIC pair, NVLink islands, the NIC nearest each
 * GPU and recommended tensor-parallel groups. GPU arguments are positions in t->gpus[] (sorted
 * by index), NIC arguments positions in t->nics[]. */
#ifndef MT_TOPO_CLASSIFY_H
#define MT_TOPO_CLASSIFY_H

#include "topo/topology.h"

#include <meshtrain/status.h>

#include <stddef.h>

/* Ordered from strongest to weakest, so that a smaller value is a better connection. */
typedef enum mt_topo_code {
    MT_TOPO_X,    /* the device itself */
    MT_TOPO_NV,   /* NVLink; the link count is in mt_topo_conn.nvlinks */
    MT_TOPO_PIX,  /* at most one PCIe bridge */
    MT_TOPO_PXB,  /* several PCIe bridges, no host bridge */
    MT_TOPO_PHB,  /* through a PCIe host bridge */
    MT_TOPO_NODE, /* between host bridges of one NUMA node */
    MT_TOPO_SYS,  /* across NUMA nodes */
} mt_topo_code;

typedef struct mt_topo_conn {
    mt_topo_code code;
    int nvlinks; /* > 0 only with MT_TOPO_NV */
} mt_topo_conn;

/* Writes the code as nvidia-smi prints it ("X", "NV18", "PIX", ...) into buf; returns buf. */
const char *mt_topo_conn_str(mt_topo_conn c, char *buf, size_t size);

/* NVLinks of a GPU to other GPUs and into NVSwitches; links naming the GPU itself do not count
 * (they reach no peer). 0 also where the source has no NVLink data (gpu->nvlink_known == 0). */
int mt_topo_gpu_nvlinks(const mt_topo *t, size_t gpu);

/* The connection between GPUs a and b: X for a == b, NV# over NVLink, else the PCIe/NUMA code. */
mt_topo_conn mt_topo_gpu_gpu(const mt_topo *t, size_t a, size_t b);
/* The PCIe/NUMA connection between a GPU and a NIC, and between two NICs (X for a == b). */
mt_topo_conn mt_topo_gpu_nic(const mt_topo *t, size_t gpu, size_t nic);
mt_topo_conn mt_topo_nic_nic(const mt_topo *t, size_t a, size_t b);

/* The NIC with the best connection to the GPU (the lowest position on ties); -1 without NICs. */
int mt_topo_nearest_nic(const mt_topo *t, size_t gpu);

/* Connected components over NVLink (direct or through switches). island_of[i] (n_gpus entries)
 * gets the island of gpus[i]; islands are numbered 0.. in the order of their first GPU, and a
 * GPU without NVLink is an island alone. *n_islands gets their number. */
mt_status mt_topo_nvlink_islands(const mt_topo *t, int *island_of, size_t *n_islands);

/* Partitions the GPUs into groups of tp: groups_out (n_gpus entries) receives GPU indices
 * (gpus[].index), group after group, each group ascending and the groups ordered by their first
 * GPU; *n_groups gets their number, 0 when tp exceeds the GPU count or does not divide it. A
 * group keeps to one NVLink island first, then prefers PIX, PXB, PHB and one NUMA node (greedy:
 * the lowest free GPU seeds each group, ties go to the lowest GPU). */
mt_status mt_topo_tp_groups(const mt_topo *t, int tp, int *groups_out, size_t *n_groups);

#endif
