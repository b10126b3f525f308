/* Internal: NVML, loaded at run time with dlopen (no build dependency): the NVLinks of each GPU,
 * and the GPUs the driver exposes (bus id and UUID, for CUDA_VISIBLE_DEVICES). The library is
 * libnvidia-ml.so.1, or the path in MT_NVML_LIBRARY (tests point it at a fake). */
#ifndef MT_TOPO_TOPO_NVML_H
#define MT_TOPO_TOPO_NVML_H

#include "topo/topology.h"

#include <stddef.h>

/* NVML's UUID buffer (NVML_DEVICE_UUID_V2_BUFFER_SIZE in nvml.h, API 13). */
#define MT_NVML_UUID_MAX 96

typedef struct mt_nvml mt_nvml;

/* A GPU as the driver exposes it: bus id in the model's spelling and "GPU-..." UUID. */
typedef struct mt_nvml_gpu {
    char bus_id[MT_TOPO_BUSID_MAX];
    char uuid[MT_NVML_UUID_MAX];
} mt_nvml_gpu;

/* Loads and initializes NVML. Fails with MT_ERR_NOT_FOUND when the library cannot be loaded,
 * MT_ERR_UNSUPPORTED when it lacks a function needed here, MT_ERR_SYSTEM when nvmlInit fails; the
 * error sentence, also written to why (may be NULL), names the library and the reason. */
mt_status mt_nvml_open(mt_nvml **out, char *why, size_t why_size);

/* Shuts NVML down and unloads it; NULL is ignored. */
void mt_nvml_close(mt_nvml *nvml);

/* The GPUs NVML sees, in NVML's order (PCI bus order), into a new array (free it). Fails with
 * MT_ERR_UNSUPPORTED when the library lacks the enumeration functions. */
mt_status mt_nvml_list_gpus(mt_nvml *nvml, mt_nvml_gpu **gpus, size_t *n);

/* Replaces the NVLinks of every GPU of t with NVML's: for each active link its remote end (a GPU,
 * an NVSwitch or another device) by PCI bus id, counts summed per remote end; each GPU NVML
 * answers for becomes nvlink_known. A GPU NVML does not know, or whose links it cannot read,
 * stays unknown and t->nvlink_note says why. Fails only for lack of memory. */
mt_status mt_nvml_probe_links(mt_nvml *nvml, mt_topo *t);

/* Open, probe, close. Where NVML cannot be used, the GPUs keep what they had and, if any GPU's
 * NVLink is then unknown, t->nvlink_note reads "NVLink unknown: <reason>"; the status is then
 * mt_nvml_open's, which a caller may ignore (the model says what is unknown) except
 * MT_ERR_OUT_OF_MEMORY. */
mt_status mt_topo_nvml_probe(mt_topo *t);

/* After mt_nvml_open failed with reason why: if some GPU's NVLink is unknown, t->nvlink_note
 * becomes "NVLink unknown: <why>". */
mt_status mt_nvml_note_failure(mt_topo *t, const char *why);

#endif
