/* Placement of local ranks on GPUs (mesh/mesh_placement.h). */
#include "mesh/mesh_placement.h"

#include "core/error.h"
#include "topo/classify.h"
#include "mesh/runtime_topo.h"

#include <meshtrain/log.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mt_status parse_device_map(const mt_topo *t, int local_world, const char *map, int *gpu) {
    const char *p = map;
    int n = 0;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= (long)t->n_gpus || (*end && *end != ','))
            return mt_error(MT_ERR_INVALID_ARG, "MT_DEVICE_MAP='%s': entry %d is not a GPU index "
                            "between 0 and %zu", map, n, t->n_gpus ? t->n_gpus - 1 : 0);
        if (n < local_world) gpu[n] = (int)v;
        n++;
        p = *end ? end + 1 : end;
    }
    if (n < local_world)
        return mt_error(MT_ERR_INVALID_ARG, "MT_DEVICE_MAP='%s' has %d entries for %d local ranks",
                        map, n, local_world);
    for (int i = 0; i < local_world; i++)
        for (int j = 0; j < i; j++)
            if (gpu[i] == gpu[j])
                mt_log(MT_LOG_WARN, "MT_DEVICE_MAP='%s': local ranks %d and %d share GPU %d", map,
                       j, i, gpu[i]);
    return MT_OK;
}

mt_status mt_placement_compute(const mt_topo *t, int local_world, int tp, const char *device_map,
                               int *gpu_of_local, char *why, size_t why_size) {
    if (local_world < 1 || tp < 1)
        return mt_error(MT_ERR_INVALID_ARG, "placement: %d local ranks, tp %d", local_world, tp);
    int g = (int)t->n_gpus;
    if (g == 0) {
        for (int l = 0; l < local_world; l++) gpu_of_local[l] = -1;
        snprintf(why, why_size, "no GPU in the topology");
        return MT_OK;
    }
    if (device_map && *device_map) {
        MT_TRY(parse_device_map(t, local_world, device_map, gpu_of_local));
        snprintf(why, why_size, "from MT_DEVICE_MAP=%s", device_map);
        return MT_OK;
    }
    for (int l = 0; l < local_world; l++) gpu_of_local[l] = t->gpus[l % g].index;
    if (local_world > g) {
        snprintf(why, why_size, "%d local ranks share %d GPUs round-robin", local_world, g);
        return MT_OK;
    }
    if (tp == 1 || local_world % tp != 0 || tp > g) {
        snprintf(why, why_size, tp == 1 ? "in order (tp 1)"
                                : "in order (tp %d does not divide the %d local ranks / %d GPUs)",
                 tp, local_world, g);
        return MT_OK;
    }
    int *groups = malloc((size_t)g * sizeof *groups);
    if (!groups) return mt_error(MT_ERR_OUT_OF_MEMORY, "placement: out of memory");
    size_t n_groups = 0;
    mt_status st = mt_topo_tp_groups(t, tp, groups, &n_groups);
    if (st == MT_OK && n_groups * (size_t)tp >= (size_t)local_world) {
        for (int l = 0; l < local_world; l++) gpu_of_local[l] = groups[l];
        snprintf(why, why_size, "tp groups of %d with the strongest links", tp);
    } else if (st == MT_OK) {
        snprintf(why, why_size, "in order (the %d GPUs do not split into groups of %d)", g, tp);
    }
    free(groups);
    return st;
}

static void log_mapping(const mt_runtime *rt, const int *gpu, int local_world, const char *why,
                        const char *source) {
    if (mt_runtime_rank(rt) != 0 || !mt_log_enabled(MT_LOG_INFO)) return;
    char line[1024];
    size_t len = 0;
    line[0] = '\0';
    for (int l = 0; l < local_world && len < sizeof line; l++)
        len += (size_t)snprintf(line + len, sizeof line - len, "%s%d->GPU%d", l ? " " : "", l,
                                gpu[l]);
    mt_log(MT_LOG_INFO, "placement (local rank->GPU, every host; topology %s; %s): %s", source,
           why, line);
}

mt_status mt_mesh_place(mt_runtime *rt, int tp, int *gpu) {
    *gpu = -1;
    const char *file = getenv("MT_TOPO_FILE");
    mt_device *dev = mt_runtime_device(rt);
    int on_gpu = dev && mt_device_get_kind(dev) == MT_DEVICE_CUDA;
    /* A CPU rank has no GPU to place; live discovery would only cost it time. */
    if (!on_gpu && !(file && *file)) return MT_OK;
    const mt_topo *t = NULL;
    MT_TRY(mt_runtime_topology(rt, &t));
    int local_world = mt_runtime_local_world_size(rt);
    int *map = malloc((size_t)local_world * sizeof *map);
    if (!map) return mt_error(MT_ERR_OUT_OF_MEMORY, "placement: out of memory");
    char why[256];
    mt_status st = mt_placement_compute(t, local_world, tp, getenv("MT_DEVICE_MAP"), map, why,
                                        sizeof why);
    if (st == MT_OK) {
        *gpu = map[mt_runtime_local_rank(rt)];
        log_mapping(rt, map, local_world, why, t->source);
    }
    free(map);
    return st;
}
