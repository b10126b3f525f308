/* A stand-in for libnvidia-ml.so.1, loaded by topo/topo_nvml.c through MT_NVML_LIBRARY. It answers
 * the entry points meshtrain uses over a small machine chosen by FAKE_NVML_MACHINE when
 * nvmlInit_v2 runs:
 *   p4d      8 A100 at the bus ids of the AWS p4d fixture, 12 links each, two into each of six
 *            NVSwitches (0000:c0..c5:00.0) that the fixture does not show
 *   pairs    the same GPUs, NVLinked in pairs (0-1, 2-3, ...) over links 0-3; links 4-11 down
 *   partial  p4d without its last GPU (0000:a0:1d.0 is unknown to NVML)
 *   linkerr  p4d where reading link 5 of GPU 0000:20:1d.0 fails
 *   initfail nvmlInit_v2 fails with "Driver Not Loaded"
 * FAKE_NVML_MARK names a file created at nvmlInit_v2, so that a test can tell whether NVML was
 * loaded at all. Built three times: complete; without nvmlDeviceGetNvLinkRemoteDeviceType
 * (FAKE_NVML_NO_REMOTE_TYPE, an NVML before 11); without nvmlDeviceGetNvLinkRemotePciInfo_v2
 * (FAKE_NVML_NO_REMOTE_PCI, unusable). Types follow nvml.h (API 13). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct fake_dev *nvmlDevice_t;

typedef struct nvmlPciInfo_st {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

enum {
    SUCCESS = 0,
    ERR_UNINITIALIZED = 1,
    ERR_INVALID_ARGUMENT = 2,
    ERR_NOT_FOUND = 6,
    ERR_DRIVER_NOT_LOADED = 9,
    ERR_UNKNOWN = 999
};
enum { TYPE_GPU = 0, TYPE_SWITCH = 2 };

#define N_GPUS 8
#define N_LINKS 12

struct fake_dev {
    unsigned bus, dev;
    int known;
};

static struct fake_dev gpus[N_GPUS] = {{0x10, 0x1c, 1}, {0x10, 0x1d, 1}, {0x20, 0x1c, 1},
                                       {0x20, 0x1d, 1}, {0x90, 0x1c, 1}, {0x90, 0x1d, 1},
                                       {0xa0, 0x1c, 1}, {0xa0, 0x1d, 1}};
static char machine[32];
static int initialized;

nvmlReturn_t nvmlInit_v2(void) {
    const char *m = getenv("FAKE_NVML_MACHINE");
    snprintf(machine, sizeof(machine), "%s", m ? m : "p4d");
    const char *mark = getenv("FAKE_NVML_MARK");
    if (mark) {
        FILE *f = fopen(mark, "w");
        if (f) fclose(f);
    }
    if (strcmp(machine, "initfail") == 0) return ERR_DRIVER_NOT_LOADED;
    for (int i = 0; i < N_GPUS; i++) gpus[i].known = !(strcmp(machine, "partial") == 0 && i == 7);
    initialized++;
    return SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return ERR_UNINITIALIZED;
    initialized--;
    return SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case SUCCESS: return "Success";
    case ERR_UNINITIALIZED: return "Uninitialized";
    case ERR_INVALID_ARGUMENT: return "Invalid Argument";
    case ERR_NOT_FOUND: return "Not Found";
    case ERR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

static int is(const char *name) { return strcmp(machine, name) == 0; }

static int count(void) {
    int n = 0;
    for (int i = 0; i < N_GPUS; i++) n += gpus[i].known;
    return n;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *busid, nvmlDevice_t *d) {
    unsigned dom, bus, dev, fn;
    if (!initialized) return ERR_UNINITIALIZED;
    if (!busid || !d || sscanf(busid, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4)
        return ERR_INVALID_ARGUMENT;
    for (int i = 0; i < N_GPUS; i++) {
        if (gpus[i].known && dom == 0 && bus == gpus[i].bus && dev == gpus[i].dev && fn == 0) {
            *d = &gpus[i];
            return SUCCESS;
        }
    }
    return ERR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) {
    if (!initialized) return ERR_UNINITIALIZED;
    *n = (unsigned)count();
    return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *d) {
    if (!initialized) return ERR_UNINITIALIZED;
    if ((int)index >= count()) return ERR_INVALID_ARGUMENT;
    *d = &gpus[index]; /* only the last GPU is ever missing */
    return SUCCESS;
}

static void fill_pci(nvmlPciInfo_t *p, unsigned bus, unsigned dev) {
    memset(p, 0, sizeof(*p));
    p->domain = 0;
    p->bus = bus;
    p->device = dev;
    snprintf(p->busIdLegacy, sizeof(p->busIdLegacy), "%04X:%02X:%02X.0", 0u, bus, dev);
    snprintf(p->busId, sizeof(p->busId), "%08X:%02X:%02X.0", 0u, bus, dev);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    if (!initialized) return ERR_UNINITIALIZED;
    fill_pci(p, d->bus, d->dev);
    return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned len) {
    if (!initialized) return ERR_UNINITIALIZED;
    snprintf(uuid, len, "GPU-a100%04d-0000-4000-8000-00000000%04x", (int)(d - gpus),
             d->bus << 8 | d->dev);
    return SUCCESS;
}

static int check_link(nvmlDevice_t d, unsigned link) {
    if (!initialized) return ERR_UNINITIALIZED;
    if (!d || link >= N_LINKS) return ERR_INVALID_ARGUMENT;
    if (is("linkerr") && d == &gpus[3] && link == 5) return ERR_UNKNOWN;
    return SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned link, int *active) {
    int r = check_link(d, link);
    if (r != SUCCESS) return r;
    *active = is("pairs") ? link < 4 : 1;
    return SUCCESS;
}

#ifndef FAKE_NVML_NO_REMOTE_PCI
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned link, nvmlPciInfo_t *p) {
    int r = check_link(d, link);
    if (r != SUCCESS) return r;
    if (is("pairs")) {
        const struct fake_dev *peer = &gpus[(d - gpus) ^ 1];
        fill_pci(p, peer->bus, peer->dev);
    } else {
        fill_pci(p, 0xc0 + link / 2, 0);
    }
    return SUCCESS;
}
#endif

#ifndef FAKE_NVML_NO_REMOTE_TYPE
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t d, unsigned link, int *type) {
    int r = check_link(d, link);
    if (r != SUCCESS) return r;
    *type = is("pairs") ? TYPE_GPU : TYPE_SWITCH;
    return SUCCESS;
}
#endif
