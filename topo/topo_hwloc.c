/* Loads an hwloc XML file (lstopo --of xml) through hwloc itself, keeping I/O objects: packages,
 * NUMA nodes with their CPU identity, the PCI tree with link rates, NVIDIA GPUs, NICs (PCI
 * devices with network or OpenFabrics OS devices), NVSwitches and the "NVLinkBandwidth"
 * distances matrix. */
#include "core/error.h"
#include "topo/nvlink_rate.h"
#include "topo/topo_hwloc.h"
#include "topo/topo_xml.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCI_VENDOR_NVIDIA 0x10de

typedef struct ctx {
    const char *what; /* "topology file x.xml" or "live topology", for messages */
    mt_topo *t;
    hwloc_topology_t h;
} ctx;

static void pci_busid(hwloc_obj_t o, char *buf, size_t size) {
    if (o->type == HWLOC_OBJ_BRIDGE && o->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST)
        snprintf(buf, size, "%04x:%02x", (unsigned)o->attr->bridge.downstream.pci.domain,
                 (unsigned)o->attr->bridge.downstream.pci.secondary_bus);
    else
        snprintf(buf, size, "%04x:%02x:%02x.%01x", (unsigned)o->attr->pcidev.domain,
                 (unsigned)o->attr->pcidev.bus, (unsigned)o->attr->pcidev.dev,
                 (unsigned)o->attr->pcidev.func);
}

/* The NUMA node id of the CPU-side object above an I/O object: -1 unless exactly one. */
static int numa_of(hwloc_topology_t h, hwloc_obj_t o, char **cpus) {
    hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(h, o);
    *cpus = NULL;
    if (!a) return -1;
    if (a->cpuset && !hwloc_bitmap_iszero(a->cpuset)) hwloc_bitmap_list_asprintf(cpus, a->cpuset);
    if (!a->nodeset || hwloc_bitmap_weight(a->nodeset) != 1) return -1;
    return hwloc_bitmap_first(a->nodeset);
}

/* A non-negative decimal info value of o, or -1. */
static int info_int(hwloc_obj_t o, const char *name) {
    const char *v = hwloc_obj_get_info_by_name(o, name);
    if (!v || !*v) return -1;
    char *end;
    long x = strtol(v, &end, 10);
    return (*end || x < 0 || x > INT_MAX) ? -1 : (int)x;
}

/* The identity of the CPUs of one NUMA node: the machine's architecture (root "Architecture") and
 * what every package sharing CPUs with the node agrees on (hwloc's x86 backend sets CPUVendor,
 * CPUFamilyNumber, CPUModelNumber; captures stripped of their CPU side have none of it). hwloc
 * counts an extended family the CPUID way (0xf + ext); NCCL's familyid is 0xf + (ext << 4). */
static mt_status add_cpu_id(ctx *c, hwloc_obj_t numa, mt_topo_cpuset *set) {
    const char *arch = hwloc_obj_get_info_by_name(hwloc_get_root_obj(c->h), "Architecture");
    const char *vendor = NULL;
    int family = -1, model = -1, first = 1, agree = 1;
    for (hwloc_obj_t p = hwloc_get_next_obj_by_type(c->h, HWLOC_OBJ_PACKAGE, NULL); p;
         p = hwloc_get_next_obj_by_type(c->h, HWLOC_OBJ_PACKAGE, p)) {
        if (!numa->cpuset || !p->cpuset || !hwloc_bitmap_intersects(numa->cpuset, p->cpuset))
            continue;
        const char *v = hwloc_obj_get_info_by_name(p, "CPUVendor");
        int f = info_int(p, "CPUFamilyNumber"), m = info_int(p, "CPUModelNumber");
        if (first) {
            vendor = v, family = f, model = m, first = 0;
        } else {
            agree &= (v && vendor && strcmp(v, vendor) == 0) && f == family && m == model;
        }
    }
    if (!agree) vendor = NULL, family = model = -1;
    if (family > 0xf + 0xff) family = -1; /* not a CPUID family: unknown */
    else if (family > 0xf) family = 0xf + ((family - 0xf) << 4);
    mt_status s = mt_topo_set_cpu_id(set, arch && *arch ? arch : NULL,
                                     vendor && *vendor ? vendor : NULL, family, model);
    return s == MT_OK ? MT_OK : mt_error_wrap(s, "%s: NUMA node %d", c->what, set->id);
}

static mt_status add_cpusets(ctx *c, hwloc_obj_type_t type) {
    for (hwloc_obj_t o = hwloc_get_next_obj_by_type(c->h, type, NULL); o;
         o = hwloc_get_next_obj_by_type(c->h, type, o)) {
        char *cpus = NULL;
        if (o->cpuset && hwloc_bitmap_list_asprintf(&cpus, o->cpuset) < 0)
            return mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of memory", c->what);
        mt_status s = mt_topo_add_cpuset(c->t, type == HWLOC_OBJ_PACKAGE, (int)o->os_index,
                                         cpus ? cpus : "");
        free(cpus);
        MT_TRY(s);
        if (type == HWLOC_OBJ_NUMANODE) MT_TRY(add_cpu_id(c, o, &c->t->numa[c->t->n_numa - 1]));
    }
    return MT_OK;
}

/* The GPU's model from its OS devices (GPUModel info), else its PCI ids. */
static void gpu_name(hwloc_obj_t o, char *buf, size_t size) {
    for (hwloc_obj_t k = o->io_first_child; k; k = k->next_sibling) {
        const char *m = hwloc_obj_get_info_by_name(k, "GPUModel");
        if (m) {
            snprintf(buf, size, "%s", m);
            return;
        }
    }
    const char *m = hwloc_obj_get_info_by_name(o, "PCIDevice");
    if (m)
        snprintf(buf, size, "%s", m);
    else
        snprintf(buf, size, "PCI %04x:%04x", (unsigned)o->attr->pcidev.vendor_id,
                 (unsigned)o->attr->pcidev.device_id);
}

/* A PCI device's NIC name: its OpenFabrics OS device (mlx5_0, rdmap79s0; *fabric set), else its
 * network one. */
static const char *nic_name(hwloc_obj_t o, int *fabric) {
    const char *net = NULL;
    *fabric = 0;
    for (hwloc_obj_t k = o->io_first_child; k; k = k->next_sibling) {
        if (k->type != HWLOC_OBJ_OS_DEVICE) continue;
        if (k->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
            *fabric = 1;
            return k->name;
        }
        if (k->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK && !net) net = k->name;
    }
    return net;
}

static mt_status add_pci_obj(ctx *c, hwloc_obj_t o, int parent, int *idx_out) {
    char busid[MT_TOPO_BUSID_MAX];
    pci_busid(o, busid, sizeof(busid));
    char *cpus = NULL;
    int numa = numa_of(c->h, o, &cpus);
    int host = o->type == HWLOC_OBJ_BRIDGE && o->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
    mt_topo_pci_kind kind = host ? MT_TOPO_PCI_HOST_BRIDGE
                            : o->type == HWLOC_OBJ_BRIDGE ? MT_TOPO_PCI_BRIDGE
                                                          : MT_TOPO_PCI_DEVICE;
    uint32_t cls = host ? 0x060000u : (uint32_t)o->attr->pcidev.class_id << 8;
    mt_status s = mt_topo_add_pci(c->t, busid, kind, parent, cls, numa, idx_out);
    /* hwloc's linkspeed: the whole link's data rate in GB/s, 0 when unknown */
    float gbps = host ? 0.0f : o->attr->pcidev.linkspeed;
    if (s == MT_OK && isfinite(gbps) && gbps > 0 && gbps < 1e6f)
        s = mt_topo_pci_set_link(c->t, *idx_out, NULL, -1, gbps);
    if (s == MT_OK && !host) {
        unsigned vendor = o->attr->pcidev.vendor_id, klass = o->attr->pcidev.class_id;
        int nvswitch = (o->subtype && strcmp(o->subtype, "NVSwitch") == 0) ||
                       (vendor == PCI_VENDOR_NVIDIA && klass == 0x0680);
        int fabric;
        const char *net = nic_name(o, &fabric);
        if (vendor == PCI_VENDOR_NVIDIA && (klass == 0x0300 || klass == 0x0302)) {
            char name[128];
            gpu_name(o, name, sizeof(name));
            s = mt_topo_add_gpu(c->t, -1, busid, name, numa, cpus ? cpus : "", *idx_out, NULL);
        } else if (nvswitch) {
            s = mt_topo_add_switch(c->t, busid, *idx_out);
        } else if (net) {
            s = mt_topo_add_nic(c->t, net, busid, numa, -1, *idx_out, fabric);
        }
    }
    free(cpus);
    return s;
}

/* Depth-first over normal and I/O children so that each PCI entry knows its PCI parent. */
static mt_status walk(ctx *c, hwloc_obj_t o, int parent, int depth) {
    if (depth > 256)
        return mt_error(MT_ERR_INVALID_ARG, "%s: object tree deeper than 256", c->what);
    int here = parent;
    if (o->type == HWLOC_OBJ_BRIDGE || o->type == HWLOC_OBJ_PCI_DEVICE)
        MT_TRY(add_pci_obj(c, o, parent, &here));
    for (hwloc_obj_t k = o->first_child; k; k = k->next_sibling) MT_TRY(walk(c, k, here, depth + 1));
    for (hwloc_obj_t k = o->io_first_child; k; k = k->next_sibling)
        MT_TRY(walk(c, k, here, depth + 1));
    return MT_OK;
}

/* Labels name what the rest of the model names: a GPU's or switch's OS device (nvml0) by the bus
 * id of its PCI device, so that rows of the matrix match gpus[] and switches[]. */
static void obj_label(hwloc_obj_t o, char *buf, size_t size) {
    if (o->type == HWLOC_OBJ_OS_DEVICE && o->parent && o->parent->type == HWLOC_OBJ_PCI_DEVICE)
        o = o->parent;
    if (o->type == HWLOC_OBJ_PCI_DEVICE)
        pci_busid(o, buf, size);
    else if (o->type == HWLOC_OBJ_OS_DEVICE && o->name)
        snprintf(buf, size, "%s", o->name);
    else
        snprintf(buf, size, "%s:%u", hwloc_obj_type_string(o->type), o->os_index);
}

static mt_status record_nvlink_bw(ctx *c) {
    unsigned nr = 1;
    struct hwloc_distances_s *d = NULL;
    if (hwloc_distances_get_by_name(c->h, "NVLinkBandwidth", &nr, &d, 0) != 0 || nr == 0)
        return MT_OK;
    mt_topo *t = c->t;
    size_t n = d->nbobjs;
    mt_status s = MT_OK;
    t->nvlink_bw = calloc(n > 0 ? n * n : 1, sizeof(*t->nvlink_bw));
    t->nvlink_bw_labels = calloc(n ? n : 1, sizeof(*t->nvlink_bw_labels));
    if (!t->nvlink_bw || !t->nvlink_bw_labels) {
        s = mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of memory", c->what);
    } else {
        memcpy(t->nvlink_bw, d->values, n * n * sizeof(*t->nvlink_bw));
        for (size_t i = 0; i < n && s == MT_OK; i++) {
            char label[64];
            obj_label(d->objs[i], label, sizeof(label));
            t->nvlink_bw_labels[i] = strdup(label);
            if (!t->nvlink_bw_labels[i])
                s = mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of memory", c->what);
            else
                t->nvlink_bw_n = i + 1;
        }
    }
    hwloc_distances_release(c->h, d);
    return s;
}

/* Each core with its PUs and NUMA node (binding hands out whole cores); PUs are only counted. */
static mt_status add_cores(ctx *c) {
    for (hwloc_obj_t o = hwloc_get_next_obj_by_type(c->h, HWLOC_OBJ_CORE, NULL); o;
         o = hwloc_get_next_obj_by_type(c->h, HWLOC_OBJ_CORE, o)) {
        char *cpus = NULL;
        if (o->cpuset && hwloc_bitmap_list_asprintf(&cpus, o->cpuset) < 0)
            return mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of memory", c->what);
        int numa = o->nodeset && hwloc_bitmap_weight(o->nodeset) == 1
                       ? hwloc_bitmap_first(o->nodeset) : -1;
        mt_status s = mt_topo_add_core(c->t, numa, cpus ? cpus : "");
        free(cpus);
        MT_TRY(s);
    }
    int n = hwloc_get_nbobjs_by_type(c->h, HWLOC_OBJ_PU);
    c->t->n_pus = n > 0 ? (size_t)n : 0;
    return MT_OK;
}

/* NVLinks from the matrix; without one, the note says where the gap comes from (a file cannot
 * tell "no NVLink" from "NVML did not run", so neither is assumed). */
static mt_status nvlinks(ctx *c) {
    MT_TRY(mt_topo_links_from_nvlink_bw(c->t));
    if (c->t->n_gpus == 0 || c->t->nvlink_note) return MT_OK;
    for (size_t i = 0; i < c->t->n_gpus; i++) {
        if (c->t->gpus[i].nvlink_known) continue;
        return mt_topo_set_nvlink_note(c->t, "NVLink unknown: %s has no NVLinkBandwidth matrix "
                                       "(hwloc records one only when its NVML backend ran and "
                                       "found active NVLinks)", c->what);
    }
    return MT_OK;
}

mt_status mt_topo_from_hwloc(hwloc_topology_t h, const char *source, const char *what,
                             mt_topo **out) {
    *out = NULL;
    ctx c = {.what = what, .h = h};
    MT_TRY(mt_topo_create(source, &c.t));
    mt_status s = add_cpusets(&c, HWLOC_OBJ_PACKAGE);
    if (s == MT_OK) s = add_cpusets(&c, HWLOC_OBJ_NUMANODE);
    if (s == MT_OK) s = add_cores(&c);
    if (s == MT_OK) s = walk(&c, hwloc_get_root_obj(h), -1, 0);
    if (s == MT_OK) s = record_nvlink_bw(&c);
    if (s == MT_OK) s = mt_topo_finish(c.t);
    if (s == MT_OK) s = nvlinks(&c);
    if (s != MT_OK) {
        mt_topo_destroy(c.t);
        return s;
    }
    *out = c.t;
    return MT_OK;
}

/* hwloc 2.9's XML import dereferences an object's complete set when the file gives the set
 * without it (found by tests/fuzz/fuzz_topo_hwloc.c; lstopo -i crashes the same way), so such
 * files are refused here, before hwloc sees them. hwloc's own export always writes both. */
static mt_status check_sets(const char *path, xmlNodePtr n, int depth) {
    static const char *const pairs[][2] = {{"cpuset", "complete_cpuset"},
                                           {"nodeset", "complete_nodeset"}};
    if (depth > 256)
        return mt_error(MT_ERR_INVALID_ARG, "topology file %s: object tree deeper than 256", path);
    for (; n; n = n->next) {
        if (n->type != XML_ELEMENT_NODE) continue;
        if (xmlStrEqual(n->name, BAD_CAST "object")) {
            for (size_t p = 0; p < sizeof(pairs) / sizeof(pairs[0]); p++) {
                if (xmlHasProp(n, BAD_CAST pairs[p][0]) && !xmlHasProp(n, BAD_CAST pairs[p][1]))
                    return mt_error(MT_ERR_INVALID_ARG,
                                    "topology file %s: line %d: object has %s but no %s", path,
                                    xmlGetLineNo(n) > 0 ? (int)xmlGetLineNo(n) : 0, pairs[p][0],
                                    pairs[p][1]);
            }
        }
        MT_TRY(check_sets(path, n->children, depth + 1));
    }
    return MT_OK;
}

static mt_status precheck(const char *path, const char *buf, size_t len) {
    xmlDocPtr doc;
    MT_TRY(mt_topo_xml_parse(path, buf, len, &doc));
    mt_status s = check_sets(path, xmlDocGetRootElement(doc), 0);
    xmlFreeDoc(doc);
    return s;
}

static void quiet_libxml(void *unused, const char *msg, ...) {
    (void)unused;
    (void)msg;
}

/* hwloc's libxml2 plugin (hwloc_xml_libxml.so) installs its own libxml2 error handler and is then
 * unloaded by hwloc_topology_destroy, leaving libxml2 calling into unmapped code on the next
 * parse error (found by tests/fuzz/fuzz_topo_hwloc.c). A handler of ours replaces it. */
static void restore_libxml_errors(void) { xmlSetGenericErrorFunc(NULL, quiet_libxml); }

mt_status mt_topo_load_hwloc_xml(const char *path, const char *buf, size_t len, mt_topo **out) {
    *out = NULL;
    if (len >= INT_MAX || buf[len] != '\0')
        return mt_error(MT_ERR_INVALID_ARG, "topology file %s is too large or not terminated", path);
    MT_TRY(precheck(path, buf, len));
    hwloc_topology_t h;
    if (hwloc_topology_init(&h) != 0)
        return mt_error(MT_ERR_SYSTEM, "topology file %s: hwloc cannot initialize", path);
    mt_status s = MT_OK;
    /* From the buffer already read and size-checked; hwloc's length counts the final NUL. */
    if (hwloc_topology_set_xmlbuffer(h, buf, (int)len + 1) != 0 ||
        hwloc_topology_set_io_types_filter(h, HWLOC_TYPE_FILTER_KEEP_ALL) != 0 ||
        hwloc_topology_load(h) != 0)
        s = mt_error(MT_ERR_INVALID_ARG, "topology file %s is not a topology hwloc can load",
                     path);
    if (s == MT_OK) {
        size_t n = strlen(path) + sizeof("topology file ");
        char *what = malloc(n);
        if (!what) {
            s = mt_error(MT_ERR_OUT_OF_MEMORY, "topology file %s: out of memory", path);
        } else {
            snprintf(what, n, "topology file %s", path);
            s = mt_topo_from_hwloc(h, path, what, out);
            free(what);
        }
    }
    hwloc_topology_destroy(h);
    restore_libxml_errors();
    return s;
}
