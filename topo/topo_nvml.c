/* NVML loaded at run time (see topo/topo_nvml.h). Nothing of NVML is needed at build time: the
 * few types and constants used are declared here as nvml.h defines them (NVML API version 13,
 * as shipped with CUDA 13; the ones used have kept their values and layout since the _v2/_v3
 * entry points appeared). */
#include "topo/topo_nvml.h"

#include "core/error.h"

#include <meshtrain/log.h>

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- from nvml.h (API 13) ------------------------------------------------------------------- */
typedef int nvml_return;              /* nvmlReturn_t */
typedef struct nvml_device *nvml_dev; /* nvmlDevice_t, opaque */
#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_FEATURE_ENABLED 1        /* nvmlEnableState_t */
#define NVML_NVLINK_MAX_LINKS 36      /* older libraries answer INVALID_ARGUMENT past their own */
#define NVML_NVLINK_DEVICE_TYPE_GPU 0 /* nvmlIntNvLinkDeviceType_t */
#define NVML_NVLINK_DEVICE_TYPE_IBMNPU 1
#define NVML_NVLINK_DEVICE_TYPE_SWITCH 2

typedef struct nvml_pci_info { /* nvmlPciInfo_t */
    char bus_id_legacy[16];    /* NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE */
    unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32]; /* NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE, "%08X:%02X:%02X.0" */
} nvml_pci_info;

typedef nvml_return (*fn_void)(void);
typedef const char *(*fn_error_string)(nvml_return);
typedef nvml_return (*fn_handle_by_busid)(const char *, nvml_dev *);
typedef nvml_return (*fn_link_int)(nvml_dev, unsigned, int *);
typedef nvml_return (*fn_link_pci)(nvml_dev, unsigned, nvml_pci_info *);
typedef nvml_return (*fn_count)(unsigned *);
typedef nvml_return (*fn_handle_by_index)(unsigned, nvml_dev *);
typedef nvml_return (*fn_uuid)(nvml_dev, char *, unsigned);
typedef nvml_return (*fn_pci)(nvml_dev, nvml_pci_info *);

struct mt_nvml {
    void *lib;
    char path[256];
    fn_void init, shutdown;
    fn_error_string error_string;                   /* optional */
    fn_handle_by_busid handle_by_busid;
    fn_link_int link_state, link_remote_type;       /* remote type optional (NVML 11+) */
    fn_link_pci link_remote_pci;
    fn_count count;                                 /* enumeration: optional */
    fn_handle_by_index handle_by_index;
    fn_uuid uuid;
    fn_pci pci;
};

static const char *nvml_strerror(const mt_nvml *n, nvml_return r, char *buf, size_t size) {
    const char *s = n->error_string ? n->error_string(r) : NULL;
    snprintf(buf, size, "%s (NVML error %d)", s ? s : "no description", r);
    return buf;
}

static void *sym(mt_nvml *n, const char *name) {
    dlerror();
    return dlsym(n->lib, name);
}

/* Fails like mt_nvml_open, with the reason also in why (no rank prefix: it goes into notes). */
static mt_status open_failed(mt_status s, char *why, size_t why_size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static mt_status open_failed(mt_status s, char *why, size_t why_size, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (why && why_size) snprintf(why, why_size, "%s", buf);
    return mt_error(s, "%s", buf);
}

mt_status mt_nvml_open(mt_nvml **out, char *why, size_t why_size) {
    *out = NULL;
    if (why && why_size) why[0] = '\0';
    mt_nvml *n = calloc(1, sizeof(*n));
    if (!n) return open_failed(MT_ERR_OUT_OF_MEMORY, why, why_size, "NVML: out of memory");
    const char *env = getenv("MT_NVML_LIBRARY");
    snprintf(n->path, sizeof(n->path), "%s", env && *env ? env : "libnvidia-ml.so.1");
    n->lib = dlopen(n->path, RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) {
        const char *err = dlerror();
        mt_status s = open_failed(MT_ERR_NOT_FOUND, why, why_size, "%s not found (%s)", n->path,
                                  err ? err : "dlopen failed");
        free(n);
        return s;
    }
    /* Casts from dlsym's void * to function pointers are what POSIX prescribes for dlsym. */
    static const char *const required[] = {"nvmlInit_v2", "nvmlShutdown",
                                           "nvmlDeviceGetHandleByPciBusId_v2",
                                           "nvmlDeviceGetNvLinkState",
                                           "nvmlDeviceGetNvLinkRemotePciInfo_v2"};
    void *req[5];
    for (size_t i = 0; i < 5; i++) {
        req[i] = sym(n, required[i]);
        if (!req[i]) {
            mt_status s = open_failed(MT_ERR_UNSUPPORTED, why, why_size,
                                      "%s lacks %s (an NVML too old for NVLink probing)", n->path,
                                      required[i]);
            dlclose(n->lib);
            free(n);
            return s;
        }
    }
    n->init = (fn_void)req[0];
    n->shutdown = (fn_void)req[1];
    n->handle_by_busid = (fn_handle_by_busid)req[2];
    n->link_state = (fn_link_int)req[3];
    n->link_remote_pci = (fn_link_pci)req[4];
    n->error_string = (fn_error_string)sym(n, "nvmlErrorString");
    n->link_remote_type = (fn_link_int)sym(n, "nvmlDeviceGetNvLinkRemoteDeviceType");
    n->count = (fn_count)sym(n, "nvmlDeviceGetCount_v2");
    n->handle_by_index = (fn_handle_by_index)sym(n, "nvmlDeviceGetHandleByIndex_v2");
    n->uuid = (fn_uuid)sym(n, "nvmlDeviceGetUUID");
    n->pci = (fn_pci)sym(n, "nvmlDeviceGetPciInfo_v3");
    nvml_return r = n->init();
    if (r != NVML_SUCCESS) {
        char buf[160];
        mt_status s = open_failed(MT_ERR_SYSTEM, why, why_size,
                                  "NVML (%s) could not initialize: %s", n->path,
                                  nvml_strerror(n, r, buf, sizeof(buf)));
        dlclose(n->lib);
        free(n);
        return s;
    }
    mt_log(MT_LOG_DEBUG, "NVML loaded from %s", n->path);
    *out = n;
    return MT_OK;
}

void mt_nvml_close(mt_nvml *n) {
    if (!n) return;
    n->shutdown();
    dlclose(n->lib);
    free(n);
}

static void pci_busid(const nvml_pci_info *p, char out[MT_TOPO_BUSID_MAX]) {
    /* The numeric fields, not the string: they hold the same and need no parsing. NVML reports
     * function 0 for a remote end, the function all GPUs and NVSwitches sit at. */
    snprintf(out, MT_TOPO_BUSID_MAX, "%04x:%02x:%02x.0", p->domain & 0xffffffffu, p->bus & 0xffu,
             p->device & 0x1fu);
}

mt_status mt_nvml_list_gpus(mt_nvml *n, mt_nvml_gpu **gpus, size_t *count) {
    *gpus = NULL;
    *count = 0;
    if (!n->count || !n->handle_by_index || !n->uuid || !n->pci)
        return mt_error(MT_ERR_UNSUPPORTED, "%s lacks the functions that enumerate GPUs",
                        n->path);
    unsigned nb = 0;
    char buf[160];
    nvml_return r = n->count(&nb);
    if (r != NVML_SUCCESS)
        return mt_error(MT_ERR_SYSTEM, "NVML (%s) cannot count GPUs: %s", n->path,
                        nvml_strerror(n, r, buf, sizeof(buf)));
    mt_nvml_gpu *g = calloc(nb ? nb : 1, sizeof(*g));
    if (!g) return mt_error(MT_ERR_OUT_OF_MEMORY, "NVML: out of memory listing GPUs");
    for (unsigned i = 0; i < nb; i++) {
        nvml_dev d;
        nvml_pci_info pci;
        memset(&pci, 0, sizeof(pci));
        r = n->handle_by_index(i, &d);
        if (r == NVML_SUCCESS) r = n->pci(d, &pci);
        if (r == NVML_SUCCESS) r = n->uuid(d, g[i].uuid, sizeof(g[i].uuid));
        if (r != NVML_SUCCESS) {
            free(g);
            return mt_error(MT_ERR_SYSTEM, "NVML (%s) cannot describe GPU %u: %s", n->path, i,
                            nvml_strerror(n, r, buf, sizeof(buf)));
        }
        g[i].uuid[sizeof(g[i].uuid) - 1] = '\0';
        pci_busid(&pci, g[i].bus_id);
    }
    *gpus = g;
    *count = nb;
    return MT_OK;
}

/* One remote end of a GPU's links, with the links summed. */
typedef struct remote {
    char target[MT_TOPO_BUSID_MAX];
    mt_topo_link_kind kind;
    int count;
} remote;

static mt_topo_link_kind kind_of(const mt_nvml *n, const mt_topo *t, nvml_dev d, unsigned link,
                                 const char *target) {
    int type = -1;
    if (n->link_remote_type && n->link_remote_type(d, link, &type) == NVML_SUCCESS) {
        if (type == NVML_NVLINK_DEVICE_TYPE_GPU) return MT_TOPO_LINK_GPU;
        if (type == NVML_NVLINK_DEVICE_TYPE_SWITCH) return MT_TOPO_LINK_SWITCH;
        if (type == NVML_NVLINK_DEVICE_TYPE_IBMNPU) return MT_TOPO_LINK_OTHER;
    }
    /* An older NVML, or "unknown": what the model knows of the bus id decides. */
    for (size_t i = 0; i < t->n_gpus; i++)
        if (strcmp(t->gpus[i].bus_id, target) == 0) return MT_TOPO_LINK_GPU;
    for (size_t i = 0; i < t->n_switches; i++)
        if (strcmp(t->switches[i].bus_id, target) == 0) return MT_TOPO_LINK_SWITCH;
    return MT_TOPO_LINK_OTHER;
}

/* Reads the active links of one GPU into r (at most NVML_NVLINK_MAX_LINKS ends). Returns 1 when
 * NVML answered for the GPU, 0 (why written) when its NVLink must stay unknown. */
static int read_links(const mt_nvml *n, const mt_topo *t, const mt_topo_gpu *g, remote *r,
                      size_t *nr, char *why, size_t why_size) {
    char buf[160];
    nvml_dev d;
    *nr = 0;
    nvml_return ret = n->handle_by_busid(g->bus_id, &d);
    if (ret != NVML_SUCCESS) {
        snprintf(why, why_size, "NVLink unknown for GPU %s: NVML has no such GPU: %s", g->bus_id,
                 nvml_strerror(n, ret, buf, sizeof(buf)));
        return 0;
    }
    for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; link++) {
        int state = 0;
        ret = n->link_state(d, link, &state);
        /* Past the GPU's last link, or a GPU without NVLink: no more links. */
        if (ret == NVML_ERROR_INVALID_ARGUMENT || ret == NVML_ERROR_NOT_SUPPORTED) break;
        if (ret != NVML_SUCCESS) {
            snprintf(why, why_size, "NVLink unknown for GPU %s: NVML cannot read link %u: %s",
                     g->bus_id, link, nvml_strerror(n, ret, buf, sizeof(buf)));
            return 0;
        }
        if (state != NVML_FEATURE_ENABLED) continue;
        nvml_pci_info pci;
        memset(&pci, 0, sizeof(pci));
        ret = n->link_remote_pci(d, link, &pci);
        if (ret != NVML_SUCCESS) {
            snprintf(why, why_size, "NVLink unknown for GPU %s: NVML gives no remote end for "
                     "active link %u: %s", g->bus_id, link, nvml_strerror(n, ret, buf, sizeof(buf)));
            return 0;
        }
        char target[MT_TOPO_BUSID_MAX];
        pci_busid(&pci, target);
        mt_topo_link_kind kind = kind_of(n, t, d, link, target);
        size_t k = 0;
        while (k < *nr && !(strcmp(r[k].target, target) == 0 && r[k].kind == kind)) k++;
        if (k == *nr) {
            snprintf(r[k].target, sizeof(r[k].target), "%s", target);
            r[k].kind = kind;
            r[k].count = 0;
            (*nr)++;
        }
        r[k].count++;
    }
    return 1;
}

mt_status mt_nvml_probe_links(mt_nvml *n, mt_topo *t) {
    char why[256] = "", first[256] = "";
    size_t unknown = 0;
    for (size_t i = 0; i < t->n_gpus; i++) {
        remote r[NVML_NVLINK_MAX_LINKS];
        size_t nr = 0;
        if (!read_links(n, t, &t->gpus[i], r, &nr, why, sizeof(why))) {
            mt_log(MT_LOG_DEBUG, "topology %s: %s", t->source, why);
            if (unknown++ == 0) snprintf(first, sizeof(first), "%s", why);
            mt_topo_gpu_clear_links(&t->gpus[i]);
            continue;
        }
        mt_topo_gpu_clear_links(&t->gpus[i]);
        for (size_t k = 0; k < nr; k++)
            MT_TRY(mt_topo_gpu_add_link(t, &t->gpus[i], r[k].target, r[k].kind, r[k].count));
        t->gpus[i].nvlink_known = 1;
    }
    if (unknown == 0) return mt_topo_set_nvlink_note(t, NULL);
    if (unknown == 1) return mt_topo_set_nvlink_note(t, "%s", first);
    return mt_topo_set_nvlink_note(t, "%s (and %zu more GPUs)", first, unknown - 1);
}

mt_status mt_nvml_note_failure(mt_topo *t, const char *why) {
    for (size_t i = 0; i < t->n_gpus; i++)
        if (!t->gpus[i].nvlink_known) return mt_topo_set_nvlink_note(t, "NVLink unknown: %s", why);
    return MT_OK;
}

mt_status mt_topo_nvml_probe(mt_topo *t) {
    mt_nvml *n = NULL;
    char why[512];
    mt_status s = mt_nvml_open(&n, why, sizeof(why));
    if (s != MT_OK) {
        mt_log(MT_LOG_DEBUG, "topology %s: NVLink not probed: %s", t->source, why);
        if (s == MT_ERR_OUT_OF_MEMORY) return s;
        mt_status s2 = mt_nvml_note_failure(t, why);
        return s2 != MT_OK ? s2 : s;
    }
    s = mt_nvml_probe_links(n, t);
    mt_nvml_close(n);
    return s;
}
