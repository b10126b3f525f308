/* Internal: where each local rank of a host should run, planned from the topology model alone.
 * Planning is pure (no system calls) so that a plan can be computed for a machine described by a
 * file (MT_TOPO_FILE) as well as for this one; mtrun applies it. */
#ifndef MT_TOPO_BIND_H
#define MT_TOPO_BIND_H

#include "topo/topology.h"

#include <stddef.h>

typedef enum mt_bind_mode {
    MT_BIND_NONE = 0, /* inherit the launcher's affinity */
    MT_BIND_NUMA,     /* the NUMA node of the rank's GPU (without GPUs: nodes spread block-wise) */
    MT_BIND_CORE,     /* a disjoint set of whole cores of that node */
} mt_bind_mode;

/* One local rank's binding. */
typedef struct mt_bind_rank {
    int gpu;     /* the GPU index the rank uses, -1 without GPUs */
    char *cpus;  /* cpu list to bind to ("24-47"); NULL when the rank is not bound */
    int *numa;   /* NUMA node ids for its memory, ascending; none when unknown */
    size_t n_numa;
    /* What the binding is, or why there is none, without a verb: "NUMA node 1 (cpus 24-47,
     * nearest GPU 3)", "--bind none", "no CPU is known near GPU 3". */
    char *desc;
} mt_bind_rank;

typedef struct mt_bind_plan {
    mt_bind_mode mode;
    size_t n_ranks;
    mt_bind_rank *ranks;
    /* NULL, or one sentence the launcher prints once: cores shared round-robin because there are
     * more ranks than cores, or a cpu list split without core information. */
    char *warning;
} mt_bind_plan;

/* Parses "none", "numa" or "core"; anything else is MT_ERR_INVALID_ARG naming the text. */
mt_status mt_bind_mode_parse(const char *text, mt_bind_mode *out);

/* "none", "numa" or "core". */
const char *mt_bind_mode_name(mt_bind_mode mode);

/* numa when the topology has GPUs, none otherwise (binding pays off when it keeps a rank next
 * to its GPU; on a CPU-only host the kernel's own placement is a fair default). */
mt_bind_mode mt_bind_default_mode(const mt_topo *t);

/* The GPU of each of n_ranks local ranks until placement is passed in: local rank i uses the GPU
 * at position i % n_gpus. *out is NULL when the topology has no GPU; free() it. */
mt_status mt_bind_default_gpus(const mt_topo *t, size_t n_ranks, int **out);

/* Plans the binding of n_ranks local ranks. rank_gpu[i] is the GPU index (mt_topo_gpu.index)
 * local rank i uses; NULL when the ranks use no GPU, in which case ranks are spread block-wise
 * over the NUMA nodes that have CPUs (and, for core, over those nodes' cores). allowed is the
 * cpu list the ranks may use (the launcher's own affinity, e.g. under taskset), NULL for all:
 * nodes and cores are cut down to it. */
mt_status mt_bind_plan_make(const mt_topo *t, size_t n_ranks, const int *rank_gpu,
                            mt_bind_mode mode, const char *allowed, mt_bind_plan **out);

/* Frees a plan; NULL is ignored. */
void mt_bind_plan_destroy(mt_bind_plan *plan);

#endif
