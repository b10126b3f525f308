/* GPU numbering by CUDA index (see topo/topo_cuda.h).
 *
 * CUDA_VISIBLE_DEVICES as the CUDA driver reads it (its documentation, and the behaviour PyTorch
 * mirrors in torch.cuda._parse_visible_devices): entries separated by commas; an entry is an
 * ordinal read like strtoul (leading blanks skipped, "1gpu2" is 1) or a GPU UUID, whole or a
 * unique prefix including "GPU-"; only the devices named before the first invalid entry (not a
 * number, negative, out of range, an unknown UUID) are visible, in the order named; a device
 * named twice leaves no device visible; an empty value hides every device. Entries of either
 * kind are accepted in one list here. */
#include "topo/topo_cuda.h"

#include "core/error.h"

#include <meshtrain/log.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifdef MT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static int find_gpu(const mt_topo *t, const char *busid) {
    for (size_t i = 0; i < t->n_gpus; i++)
        if (strcmp(t->gpus[i].bus_id, busid) == 0) return (int)i;
    return -1;
}

#define HIDDEN -1         /* assign[]: not visible to this process */
#define NOT_EXPOSED -2    /* assign[]: the driver does not expose it at all */

/* Drops every GPU without an index in assign[], gives the others theirs, sorts by index. */
static mt_status apply(mt_topo *t, const int *assign, const char *why) {
    for (size_t i = t->n_gpus; i-- > 0;) {
        if (assign[i] >= 0) {
            t->gpus[i].index = assign[i];
            continue;
        }
        mt_log(MT_LOG_INFO, "topology %s: GPU %s is not visible to this process (%s); it is left "
               "out of the topology", t->source, t->gpus[i].bus_id,
               assign[i] == NOT_EXPOSED ? "the NVIDIA driver does not expose it" : why);
        mt_topo_drop_gpu(t, i);
    }
    return mt_topo_finish(t);
}

static mt_status number_from_runtime(mt_topo *t, const mt_topo_cuda_view *v, int *assign) {
    for (size_t k = 0; k < v->n_runtime; k++) {
        char busid[MT_TOPO_BUSID_MAX];
        const char *raw = v->runtime_busids[k] ? v->runtime_busids[k] : "";
        if (mt_topo_busid_canon(raw, busid) != MT_OK) {
            mt_log(MT_LOG_WARN, "topology %s: the CUDA runtime gives device %zu the bus id '%s', "
                   "which is not a PCI bus id; that index is left unused", t->source, k, raw);
            continue;
        }
        int pos = find_gpu(t, busid);
        if (pos < 0)
            mt_log(MT_LOG_WARN, "topology %s: CUDA device %zu (%s) is not among the GPUs hwloc "
                   "found; that index is left unused", t->source, k, busid);
        else
            assign[pos] = (int)k;
    }
    return apply(t, assign, "the CUDA runtime does not list it");
}

/* One ordinal: the bus id CUDA gives it and the model GPU there (-1: hwloc did not find it). */
typedef struct ordinal {
    char busid[MT_TOPO_BUSID_MAX];
    const char *uuid; /* NULL without NVML */
    int pos;
} ordinal;

static int cmp_ordinal(const void *a, const void *b) {
    return strcmp(((const ordinal *)a)->busid, ((const ordinal *)b)->busid);
}

/* The devices CUDA ordinals count, in PCI bus order. */
static mt_status ordinals(const mt_topo *t, const mt_topo_cuda_view *v, int *assign,
                          ordinal **out, size_t *n_out) {
    size_t n = v->driver ? v->n_driver : t->n_gpus;
    ordinal *o = calloc(n ? n : 1, sizeof(*o));
    if (!o) return mt_error(MT_ERR_OUT_OF_MEMORY, "topology %s: out of memory", t->source);
    for (size_t i = 0; i < n; i++) {
        if (v->driver) {
            if (mt_topo_busid_canon(v->driver[i].bus_id, o[i].busid) != MT_OK) {
                free(o);
                return mt_error(MT_ERR_INVALID_ARG, "topology %s: NVML gives GPU %zu the bus id "
                                "'%s'", t->source, i, v->driver[i].bus_id);
            }
            o[i].uuid = v->driver[i].uuid;
            o[i].pos = find_gpu(t, o[i].busid);
        } else {
            snprintf(o[i].busid, sizeof(o[i].busid), "%s", t->gpus[i].bus_id);
            o[i].pos = (int)i;
        }
    }
    qsort(o, n, sizeof(*o), cmp_ordinal);
    if (v->driver) {
        /* GPUs hwloc shows but the driver does not expose (a container given some of the host's
         * GPUs) have no ordinal and are never visible. */
        for (size_t i = 0; i < t->n_gpus; i++) {
            int exposed = 0;
            for (size_t k = 0; k < n && !exposed; k++) exposed = o[k].pos == (int)i;
            if (!exposed) assign[i] = NOT_EXPOSED;
        }
    }
    *out = o;
    *n_out = n;
    return MT_OK;
}

/* The ordinal a UUID entry names: -1 when none or several match (invalid for CUDA). */
static long by_uuid(const ordinal *o, size_t n, const char *entry, size_t len) {
    long found = -1;
    for (size_t i = 0; i < n; i++) {
        if (!o[i].uuid || strncasecmp(o[i].uuid, entry, len) != 0) continue;
        if (found >= 0) return -1;
        found = (long)i;
    }
    return found;
}

/* The ordinal an entry names; -1 when it is invalid (the list ends there). */
static long parse_entry(const mt_topo *t, const ordinal *o, size_t n, const char *e, size_t len,
                        int have_uuids, mt_status *unsupported) {
    while (len && isspace((unsigned char)*e)) e++, len--;
    while (len && isspace((unsigned char)e[len - 1])) len--;
    if (len >= 4 && strncasecmp(e, "MIG-", 4) == 0) {
        *unsupported = mt_error(MT_ERR_UNSUPPORTED, "topology %s: CUDA_VISIBLE_DEVICES names a MIG "
                                "instance (%.*s); MIG devices cannot be numbered here", t->source,
                                (int)len, e);
        return -1;
    }
    if (len >= 4 && strncasecmp(e, "GPU-", 4) == 0) {
        if (!have_uuids) {
            *unsupported = mt_error(MT_ERR_UNSUPPORTED, "topology %s: CUDA_VISIBLE_DEVICES names "
                                    "GPU %.*s by UUID, which needs NVML (libnvidia-ml.so.1) to "
                                    "resolve, and NVML is not loaded", t->source, (int)len, e);
            return -1;
        }
        long k = by_uuid(o, n, e, len);
        if (k < 0)
            mt_log(MT_LOG_INFO, "topology %s: CUDA_VISIBLE_DEVICES entry %.*s matches no GPU or "
                   "several; CUDA ends the list there", t->source, (int)len, e);
        return k;
    }
    size_t i = len && e[0] == '+' ? 1 : 0;
    unsigned long long val = 0;
    size_t digits = 0;
    while (i < len && isdigit((unsigned char)e[i])) {
        if (val < 1000000) val = val * 10 + (unsigned long long)(e[i] - '0');
        i++, digits++;
    }
    if (digits == 0 || val >= n) {
        mt_log(MT_LOG_INFO, "topology %s: CUDA_VISIBLE_DEVICES entry '%.*s' is not a device "
               "ordinal below %zu; CUDA ends the list there", t->source, (int)len, e, n);
        return -1;
    }
    if (i < len)
        mt_log(MT_LOG_DEBUG, "topology %s: CUDA_VISIBLE_DEVICES entry '%.*s' is read as %llu, "
               "as CUDA reads it", t->source, (int)len, e, val);
    return (long)val;
}

static void note_order(const mt_topo *t, const char *order) {
    if (order && strcmp(order, "PCI_BUS_ID") == 0) return;
    if (order && strcmp(order, "FASTEST_FIRST") != 0)
        mt_log(MT_LOG_WARN, "topology %s: CUDA_DEVICE_ORDER=%s is neither FASTEST_FIRST nor "
               "PCI_BUS_ID; CUDA's default, FASTEST_FIRST, is assumed", t->source, order);
    mt_log(MT_LOG_DEBUG, "topology %s: CUDA_DEVICE_ORDER is FASTEST_FIRST, whose order only the "
           "CUDA runtime knows; GPUs are numbered in PCI bus order (set CUDA_DEVICE_ORDER="
           "PCI_BUS_ID to make CUDA agree)", t->source);
}

static mt_status number_from_env(mt_topo *t, const mt_topo_cuda_view *v, int *assign) {
    ordinal *o = NULL;
    size_t n = 0;
    MT_TRY(ordinals(t, v, assign, &o, &n));
    note_order(t, v->device_order);
    long *visible = calloc(n + 1, sizeof(*visible));
    if (!visible) {
        free(o);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "topology %s: out of memory", t->source);
    }
    size_t nv = 0;
    mt_status unsupported = MT_OK;
    if (!v->visible_devices) {
        for (size_t k = 0; k < n; k++) visible[nv++] = (long)k;
    } else if (strspn(v->visible_devices, " \t") == strlen(v->visible_devices)) {
        mt_log(MT_LOG_INFO, "topology %s: CUDA_VISIBLE_DEVICES is empty, which hides every GPU",
               t->source);
    } else {
        const char *p = v->visible_devices;
        for (;;) {
            const char *end = strchr(p, ',');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            long k = parse_entry(t, o, n, p, len, v->driver != NULL, &unsupported);
            if (k < 0) break;
            int repeated = 0;
            for (size_t j = 0; j < nv; j++) repeated |= visible[j] == k;
            if (repeated) {
                mt_log(MT_LOG_INFO, "topology %s: CUDA_VISIBLE_DEVICES=%s names a device twice, "
                       "which leaves CUDA no device", t->source, v->visible_devices);
                nv = 0;
                break;
            }
            visible[nv++] = k;
            if (!end || nv > n) break;
            p = end + 1;
        }
    }
    for (size_t k = 0; k < nv && unsupported == MT_OK; k++) {
        const ordinal *d = &o[visible[k]];
        if (d->pos >= 0)
            assign[d->pos] = (int)k;
        else
            mt_log(MT_LOG_WARN, "topology %s: CUDA device %zu is GPU %s, which hwloc did not "
                   "find; that index is left unused", t->source, k, d->busid);
    }
    free(visible);
    free(o);
    if (unsupported != MT_OK) return unsupported;
    return apply(t, assign, "CUDA_VISIBLE_DEVICES leaves it out");
}

mt_status mt_topo_cuda_number(mt_topo *t, const mt_topo_cuda_view *v) {
    if (t->n_gpus == 0) return MT_OK;
    int *assign = malloc(t->n_gpus * sizeof(*assign));
    if (!assign) return mt_error(MT_ERR_OUT_OF_MEMORY, "topology %s: out of memory", t->source);
    for (size_t i = 0; i < t->n_gpus; i++) assign[i] = HIDDEN;
    mt_status s = v->runtime_busids ? number_from_runtime(t, v, assign)
                                    : number_from_env(t, v, assign);
    free(assign);
    return s;
}

#ifdef MT_HAVE_CUDA
/* The runtime's bus id per index, or 0 (quietly) where there is no usable device or driver. */
static size_t runtime_busids(char (**ids)[MT_TOPO_BUSID_MAX + 16]) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        mt_log(MT_LOG_DEBUG, "topology: the CUDA runtime reports no device (%s); GPUs are numbered "
               "from CUDA_VISIBLE_DEVICES and PCI order", cudaGetErrorString(e));
        (void)cudaGetLastError(); /* leave no error behind for the program's own CUDA calls */
        return 0;
    }
    *ids = calloc((size_t)count, sizeof(**ids));
    if (!*ids) return 0;
    for (int k = 0; k < count; k++) {
        e = cudaDeviceGetPCIBusId((*ids)[k], (int)sizeof((*ids)[k]), k);
        if (e != cudaSuccess) {
            mt_log(MT_LOG_DEBUG, "topology: the CUDA runtime gives no bus id for device %d (%s)",
                   k, cudaGetErrorString(e));
            (void)cudaGetLastError();
            free(*ids);
            *ids = NULL;
            return 0;
        }
    }
    return (size_t)count;
}
#endif

mt_status mt_topo_cuda_number_live(mt_topo *t, const mt_nvml_gpu *driver, size_t n_driver) {
    if (t->n_gpus == 0) return MT_OK;
    mt_topo_cuda_view v = {.visible_devices = getenv("CUDA_VISIBLE_DEVICES"),
                           .device_order = getenv("CUDA_DEVICE_ORDER"),
                           .driver = driver,
                           .n_driver = n_driver};
    const char **ptrs = NULL;
#ifdef MT_HAVE_CUDA
    char(*ids)[MT_TOPO_BUSID_MAX + 16] = NULL;
    size_t n = runtime_busids(&ids);
    if (n > 0) ptrs = malloc(n * sizeof(*ptrs));
    for (size_t k = 0; ptrs && k < n; k++) ptrs[k] = ids[k];
    if (ptrs) {
        v.runtime_busids = ptrs;
        v.n_runtime = n;
    }
#endif
    mt_status s = mt_topo_cuda_number(t, &v);
    if (s == MT_ERR_UNSUPPORTED) {
        mt_log(MT_LOG_WARN, "%s; GPUs are numbered in PCI bus order and none is left out",
               mt_last_error());
        s = MT_OK;
    }
    free(ptrs);
#ifdef MT_HAVE_CUDA
    free(ids);
#endif
    return s;
}
