/* Loads an NCCL topology XML (NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE): <system> holding <cpu numaid
 * affinity> elements, each holding nested <pci busid class>, <gpu dev> with <nvlink target count
 * tclass>, and <nic><net name speed/></nic>. Vendor files (Azure) list GPUs and NICs as bare <pci>
 * entries by class, so a GPU- or network-class <pci> without <gpu> or <nic> is still one.
 *
 * <cpu arch vendor familyid modelid> and <pci link_speed link_width> are kept as written.
 *
 * Attributes named mt_* carry what NCCL's format cannot hold; mt-topo's NCCL export writes them
 * and NCCL ignores them (see topo/export_nccl.c, docs/mt-topo.md): <system mt_packages mt_cores
 * mt_pus mt_nvlink_note>, <pci mt_host_bridge> on a top-level <pci>, <pci mt_link_gbps> (the
 * link's total rate as hwloc gave it; link_speed/link_width beside it are only NCCL's reading of
 * it and are not kept), <gpu mt_name mt_nvlink>. */
#include "core/error.h"
#include "topo/topo_xml.h"
#include "topo/topology.h"

#include <meshtrain/log.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NVLINK_MAX_COUNT 64  /* per link entry; real GPUs have at most 18 */
#define NVLINK_MAX_ENTRIES 64 /* per GPU */
#define GPU_MAX_DEV 1023
#define NUMA_MAX_ID 4095
#define AFFINITY_MAX_WORDS 1024 /* 32768 CPUs */
#define NET_MAX_SPEED 100000000LL /* Mb/s */
#define MAX_DEPTH 32
/* NCCL's name for an NVSwitch the host cannot see (in a VM). */
#define HIDDEN_SWITCH "fffffff:ff:ff.0"
#define CLASS_NVSWITCH 0x068000u
#define CLASS_HOST_BRIDGE 0x060000u
#define CPU_WORDS (MT_TOPO_CPUS_MAX / 32) /* cpu lists in mt_* attributes */
/* Packages and cores in mt_* attributes: each holds a CPU of its own on any machine, so never
 * more than there are CPU numbers; the bound keeps a short damaged attribute ("0:0*32768"
 * repeated) from growing into billions of entries. */
#define CPUSETS_MAX MT_TOPO_CPUS_MAX
#define TEXT_(x) #x
#define TEXT(x) TEXT_(x)
#define LINK_WIDTH_MAX 1024 /* lanes; NCCL adds up the widths of virtual NICs' parents */
#define CPU_ID_MAX 65535     /* familyid, modelid */

typedef struct ctx {
    const char *path;
    mt_topo *t;
} ctx;

static int is_elem(xmlNodePtr n, const char *name) {
    return n->type == XML_ELEMENT_NODE && strcmp((const char *)n->name, name) == 0;
}

static char *attr(xmlNodePtr n, const char *name) {
    return (char *)xmlGetProp(n, (const xmlChar *)name);
}

static mt_status bad(ctx *c, xmlNodePtr n, const char *fmt, const char *a, const char *b) {
    char what[256];
    snprintf(what, sizeof(what), fmt, a ? a : "", b ? b : "");
    return mt_error(MT_ERR_INVALID_ARG, "topology file %s, line %ld, <%s>: %s", c->path,
                    xmlGetLineNo(n), (const char *)n->name, what);
}

/* Reads an integer attribute (decimal or 0x hex) within [min, max]; absent gives dflt. */
static mt_status int_attr(ctx *c, xmlNodePtr n, const char *name, long long min, long long max,
                          long long dflt, long long *out) {
    char *v = attr(n, name);
    *out = dflt;
    if (!v) return MT_OK;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 0);
    mt_status s = MT_OK;
    if (!*v || errno || *end || x < min || x > max) {
        char range[96];
        snprintf(range, sizeof(range), "%s is '%.40s', not a number in [%lld, %lld]", name, v,
                 min, max);
        s = bad(c, n, "%s%s", range, "");
    } else {
        *out = x;
    }
    xmlFree(v);
    return s;
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* "hi,...,lo": comma-separated 32-bit hex words, most significant first, into a cpu list. */
static mt_status parse_affinity(ctx *c, xmlNodePtr n, const char *mask, char **out) {
    size_t n_words = 1;
    for (const char *p = mask; *p; p++) n_words += *p == ',';
    if (n_words > AFFINITY_MAX_WORDS) return bad(c, n, "affinity has too many words%s%s", "", "");
    uint32_t *words = calloc(n_words, sizeof(*words));
    if (!words) return mt_error(MT_ERR_OUT_OF_MEMORY, "topology file %s: out of memory", c->path);
    size_t w = n_words; /* the first word written is the most significant */
    const char *p = mask;
    mt_status s = MT_OK;
    while (s == MT_OK) {
        uint32_t v = 0;
        int digits = 0;
        for (; *p && *p != ','; p++, digits++) {
            int h = hexval(*p);
            if (h < 0 || digits >= 8) {
                s = bad(c, n, "affinity '%.80s' is not comma-separated 32-bit hex words%s", mask,
                        "");
                break;
            }
            v = v << 4 | (uint32_t)h;
        }
        if (s != MT_OK) break;
        if (digits == 0) {
            s = bad(c, n, "affinity '%.80s' has an empty word%s", mask, "");
            break;
        }
        words[--w] = v;
        if (!*p) break;
        p++;
    }
    if (s == MT_OK) s = mt_topo_cpulist(words, n_words, out);
    free(words);
    return s;
}

/* Reads <nvlink> children of a <gpu>. The target's kind is settled after the whole file is read
 * (a GPU-class target may name a GPU further down). */
static mt_status read_nvlinks(ctx *c, xmlNodePtr gnode, mt_topo_gpu *gpu) {
    size_t entries = 0;
    for (xmlNodePtr n = gnode->children; n; n = n->next) {
        if (!is_elem(n, "nvlink")) continue;
        if (++entries > NVLINK_MAX_ENTRIES)
            return bad(c, n, "a GPU has more than 64 <nvlink> entries%s%s", "", "");
        long long count, tclass;
        MT_TRY(int_attr(c, n, "count", 1, NVLINK_MAX_COUNT, -1, &count));
        if (count < 0) return bad(c, n, "count is missing%s%s", "", "");
        MT_TRY(int_attr(c, n, "tclass", 0, 0xffffff, -1, &tclass));
        char *target = attr(n, "target");
        if (!target || !*target) {
            xmlFree(target);
            return bad(c, n, "target is missing%s%s", "", "");
        }
        int hidden = strcmp(target, HIDDEN_SWITCH) == 0;
        mt_topo_link_kind kind = MT_TOPO_LINK_OTHER;
        if (tclass == CLASS_NVSWITCH || (tclass < 0 && hidden))
            kind = MT_TOPO_LINK_SWITCH;
        else if (tclass < 0 || (tclass >> 16) == 0x03)
            kind = MT_TOPO_LINK_GPU;
        mt_status s = mt_topo_gpu_add_link(c->t, gpu, hidden ? "switch" : target, kind, (int)count);
        xmlFree(target);
        MT_TRY(s);
    }
    gpu->nvlink_known = 1; /* an NCCL file lists every NVLink of a GPU: none means none */
    return MT_OK;
}

static mt_status gpu_name(xmlNodePtr pci, char *name, size_t size) {
    char *vendor = attr(pci, "vendor"), *device = attr(pci, "device");
    if (vendor && device && strlen(vendor) > 2 && strlen(device) > 2)
        snprintf(name, size, "PCI %.8s:%.8s", vendor + 2, device + 2);
    else
        snprintf(name, size, "GPU");
    xmlFree(vendor);
    xmlFree(device);
    return MT_OK;
}

/* <gpu mt_nvlink="unknown">: NVLink was unknown where the file was written (no NVLink child may
 * follow); any other value is refused. */
static mt_status nvlink_unknown(ctx *c, xmlNodePtr gnode, int *unknown) {
    char *v = attr(gnode, "mt_nvlink");
    *unknown = 0;
    if (!v) return MT_OK;
    mt_status s = MT_OK;
    if (strcmp(v, "unknown") != 0) {
        s = bad(c, gnode, "mt_nvlink is '%.40s', expected 'unknown'%s", v, "");
    } else {
        for (xmlNodePtr n = gnode->children; n && s == MT_OK; n = n->next)
            if (is_elem(n, "nvlink")) s = bad(c, n, "the GPU says mt_nvlink=\"unknown\" but lists NVLinks%s%s", "", "");
        *unknown = 1;
    }
    xmlFree(v);
    return s;
}

static mt_status add_gpu(ctx *c, xmlNodePtr pci, xmlNodePtr gnode, const char *busid, int pci_idx,
                         int numa, const char *cpus) {
    long long dev = -1;
    int unknown = 0;
    if (gnode) MT_TRY(int_attr(c, gnode, "dev", 0, GPU_MAX_DEV, -1, &dev));
    if (gnode) MT_TRY(nvlink_unknown(c, gnode, &unknown));
    char name[64];
    gpu_name(pci, name, sizeof(name));
    char *own = gnode ? attr(gnode, "mt_name") : NULL;
    mt_topo_gpu *gpu;
    mt_status s = mt_topo_add_gpu(c->t, (int)dev, busid, own ? own : name, numa, cpus, pci_idx, &gpu);
    xmlFree(own);
    MT_TRY(s);
    if (!gnode) return MT_OK;
    MT_TRY(read_nvlinks(c, gnode, gpu));
    if (unknown) gpu->nvlink_known = 0;
    return MT_OK;
}

/* The host bridge named by a top-level <pci mt_host_bridge="dddd:bb">, found or added, so that
 * devices under one host bridge are PHB to each other again (not NODE). */
static mt_status host_bridge(ctx *c, xmlNodePtr n, int numa, int *parent) {
    char *hb = attr(n, "mt_host_bridge");
    if (!hb) return MT_OK;
    mt_status s = MT_OK;
    int found = -1;
    for (size_t i = 0; i < c->t->n_pci && found < 0; i++)
        if (c->t->pci[i].kind == MT_TOPO_PCI_HOST_BRIDGE && strcmp(c->t->pci[i].bus_id, hb) == 0)
            found = (int)i;
    if (!*hb)
        s = bad(c, n, "mt_host_bridge is empty%s%s", "", "");
    else if (found < 0)
        s = mt_topo_add_pci(c->t, hb, MT_TOPO_PCI_HOST_BRIDGE, -1, CLASS_HOST_BRIDGE, numa, &found);
    else if (c->t->pci[found].numa != numa)
        s = bad(c, n, "host bridge %s appears under two NUMA nodes%s", hb, "");
    xmlFree(hb);
    if (s == MT_OK) *parent = found;
    return s;
}

static mt_status add_nics(ctx *c, xmlNodePtr nic, const char *busid, int pci_idx, int numa) {
    for (xmlNodePtr n = nic->children; n; n = n->next) {
        if (!is_elem(n, "net")) continue;
        long long speed;
        MT_TRY(int_attr(c, n, "speed", 0, NET_MAX_SPEED, -1, &speed));
        char *name = attr(n, "name");
        mt_status s = mt_topo_add_nic(c->t, name ? name : "", busid, numa, speed, pci_idx, 1);
        xmlFree(name);
        MT_TRY(s);
    }
    return MT_OK;
}

/* <pci link_speed link_width>, or mt_link_gbps where mt-topo wrote an hwloc link rate. */
static mt_status read_link(ctx *c, xmlNodePtr n, int idx) {
    char *gbps = attr(n, "mt_link_gbps");
    if (gbps) {
        char *end;
        errno = 0;
        double g = strtod(gbps, &end);
        mt_status s = (!*gbps || *end || errno || !isfinite(g) || g <= 0 || g >= 1e6)
                          ? bad(c, n, "mt_link_gbps is '%.40s', not a rate in GB/s%s", gbps, "")
                          : mt_topo_pci_set_link(c->t, idx, NULL, -1, (float)g);
        xmlFree(gbps);
        return s;
    }
    long long width = -1;
    char *w = attr(n, "link_width");
    mt_status s = w && *w ? int_attr(c, n, "link_width", 0, LINK_WIDTH_MAX, -1, &width) : MT_OK;
    xmlFree(w);
    MT_TRY(s);
    char *speed = attr(n, "link_speed");
    if (speed && strlen(speed) >= MT_TOPO_LINK_SPEED_MAX)
        s = bad(c, n, "link_speed '%.40s' is longer than 31 characters%s", speed, "");
    else
        s = mt_topo_pci_set_link(c->t, idx, speed, (int)width, 0);
    xmlFree(speed);
    return s;
}

/* <cpu arch vendor familyid modelid>, as NCCL wrote them, for NUMA node set. */
static mt_status read_cpu_id(ctx *c, xmlNodePtr n, mt_topo_cpuset *set) {
    long long family, model;
    MT_TRY(int_attr(c, n, "familyid", 0, CPU_ID_MAX, -1, &family));
    MT_TRY(int_attr(c, n, "modelid", 0, CPU_ID_MAX, -1, &model));
    char *arch = attr(n, "arch"), *vendor = attr(n, "vendor");
    mt_status s = MT_OK;
    if ((arch && strlen(arch) >= MT_TOPO_CPU_STR_MAX) ||
        (vendor && strlen(vendor) >= MT_TOPO_CPU_STR_MAX))
        s = bad(c, n, "arch '%.40s' or vendor '%.40s' is longer than 31 characters", arch, vendor);
    else
        s = mt_topo_set_cpu_id(set, arch, vendor, (int)family, (int)model);
    xmlFree(arch);
    xmlFree(vendor);
    return s;
}

/* Walks the children of a <cpu> or <pci>; parent is the enclosing <pci>'s index or -1. */
static mt_status walk(ctx *c, xmlNodePtr node, int parent, const char *parent_busid, int numa,
                      const char *cpus, int depth) {
    if (depth > MAX_DEPTH) return bad(c, node, "PCI nesting deeper than 32 levels%s%s", "", "");
    for (xmlNodePtr n = node->children; n; n = n->next) {
        if (n->type != XML_ELEMENT_NODE) continue;
        if (is_elem(n, "nic")) {
            MT_TRY(add_nics(c, n, parent_busid, parent, numa));
            continue;
        }
        if (is_elem(n, "gpu")) {
            if (parent < 0) return bad(c, n, "<gpu> is not inside a <pci>%s%s", "", "");
            continue; /* handled with its <pci> */
        }
        if (!is_elem(n, "pci")) continue;
        long long cls;
        MT_TRY(int_attr(c, n, "class", 0, 0xffffff, 0, &cls));
        char *busid = attr(n, "busid");
        if (!busid || !*busid) {
            xmlFree(busid);
            return bad(c, n, "busid is missing%s%s", "", "");
        }
        int idx = -1, up = parent;
        mt_topo_pci_kind kind = ((cls >> 8) == 0x0604) ? MT_TOPO_PCI_BRIDGE : MT_TOPO_PCI_DEVICE;
        mt_status s = depth == 0 ? host_bridge(c, n, numa, &up) : MT_OK;
        if (s == MT_OK) s = mt_topo_add_pci(c->t, busid, kind, up, (uint32_t)cls, numa, &idx);
        if (s == MT_OK) s = read_link(c, n, idx);
        xmlNodePtr gnode = NULL, nicnode = NULL;
        for (xmlNodePtr k = n->children; k; k = k->next) {
            if (is_elem(k, "gpu") && !gnode) gnode = k;
            if (is_elem(k, "nic") && !nicnode) nicnode = k;
        }
        if (s == MT_OK && (gnode || (cls >> 16) == 0x03))
            s = add_gpu(c, n, gnode, busid, idx, numa, cpus);
        if (s == MT_OK && (cls >> 16) == 0x02 && !nicnode)
            s = mt_topo_add_nic(c->t, "", busid, numa, -1, idx, (cls >> 8) == 0x0207);
        if (s == MT_OK && cls == CLASS_NVSWITCH) s = mt_topo_add_switch(c->t, busid, idx);
        if (s == MT_OK) s = walk(c, n, idx, busid, numa, cpus, depth + 1);
        xmlFree(busid);
        MT_TRY(s);
    }
    return MT_OK;
}

static const mt_topo_gpu *gpu_by_busid(const mt_topo *t, const char *busid) {
    for (size_t i = 0; i < t->n_gpus; i++)
        if (strcmp(t->gpus[i].bus_id, busid) == 0) return &t->gpus[i];
    return NULL;
}

static int has_switch(const mt_topo *t, const char *busid) {
    for (size_t i = 0; i < t->n_switches; i++)
        if (strcmp(t->switches[i].bus_id, busid) == 0) return 1;
    return 0;
}

/* Settles NVLink targets now that every GPU is known; records the switches they name. */
static mt_status check_links(ctx *c) {
    mt_topo *t = c->t;
    for (size_t i = 0; i < t->n_gpus; i++) {
        mt_topo_gpu *g = &t->gpus[i];
        for (size_t j = 0; j < g->n_links; j++) {
            mt_topo_nvlink *l = &g->links[j];
            if (l->kind == MT_TOPO_LINK_SWITCH && strcmp(l->target, "switch") != 0 &&
                !has_switch(t, l->target))
                MT_TRY(mt_topo_add_switch(t, l->target, -1));
            if (l->kind != MT_TOPO_LINK_GPU) continue;
            if (strcmp(l->target, g->bus_id) == 0) {
                mt_log(MT_LOG_WARN,
                       "topology file %s: GPU %s has an NVLink entry naming itself (%d links); "
                       "kept as a self link",
                       c->path, g->bus_id, l->count);
                l->kind = MT_TOPO_LINK_SELF;
            } else if (!gpu_by_busid(t, l->target)) {
                return mt_error(MT_ERR_INVALID_ARG,
                                "topology file %s: GPU %s has an NVLink to %s, which names no GPU "
                                "of the file",
                                c->path, g->bus_id, l->target);
            }
        }
    }
    return MT_OK;
}

/* mt_packages="id:cpus;...". */
static mt_status read_packages(ctx *c, xmlNodePtr root) {
    char *v = attr(root, "mt_packages");
    if (!v) return MT_OK;
    mt_status s = MT_OK;
    uint32_t *words = calloc(CPU_WORDS, sizeof(*words));
    if (!words) s = mt_error(MT_ERR_OUT_OF_MEMORY, "topology file %s: out of memory", c->path);
    for (char *item = v, *next; s == MT_OK && item && *item; item = next) {
        next = strchr(item, ';');
        if (next) *next++ = '\0';
        char *colon = strchr(item, ':'), *end = NULL;
        long id = colon ? strtol(item, &end, 10) : -1;
        int max_cpu;
        if (!colon || end != colon || id < 0 || id > NUMA_MAX_ID ||
            mt_topo_cpulist_parse(colon + 1, words, CPU_WORDS, &max_cpu) != MT_OK)
            s = bad(c, root, "mt_packages item '%.60s' is not <id>:<cpu list>%s", item, "");
        else if (c->t->n_packages >= CPUSETS_MAX)
            s = bad(c, root, "mt_packages lists more than %s packages%s", TEXT(CPUSETS_MAX), "");
        else
            s = mt_topo_add_cpuset(c->t, 1, (int)id, colon + 1);
    }
    free(words);
    xmlFree(v);
    return s;
}

/* mt_cores="numa:pus[*run];...": a run stands for cores whose PUs are the first's plus 0..run-1. */
static mt_status read_cores(ctx *c, xmlNodePtr root) {
    char *v = attr(root, "mt_cores");
    if (!v) return MT_OK;
    mt_status s = MT_OK;
    char shifted[256];
    for (char *item = v, *next; s == MT_OK && item && *item; item = next) {
        next = strchr(item, ';');
        if (next) *next++ = '\0';
        char *colon = strchr(item, ':'), *star = strchr(item, '*'), *end = NULL;
        long numa = colon ? strtol(item, &end, 10) : -2, run = 1;
        if (star) {
            *star = '\0';
            char *rend;
            run = strtol(star + 1, &rend, 10);
            if (*rend || rend == star + 1) run = 0;
        }
        if (!colon || end != colon || numa < -1 || numa > NUMA_MAX_ID || run < 1 ||
            run > CPUSETS_MAX) {
            s = bad(c, root, "mt_cores item '%.60s' is not <numa>:<cpu list>[*<count>]%s", item, "");
            break;
        }
        if ((size_t)run > CPUSETS_MAX - c->t->n_cores) {
            s = bad(c, root, "mt_cores lists more than %s cores%s", TEXT(CPUSETS_MAX), "");
            break;
        }
        for (long k = 0; k < run && s == MT_OK; k++) {
            if (mt_topo_cpulist_shift(colon + 1, (int)k, shifted, sizeof(shifted)) != MT_OK)
                s = bad(c, root, "mt_cores item '%.60s' has CPUs out of range%s", colon + 1, "");
            else
                s = mt_topo_add_core(c->t, (int)numa, shifted);
        }
    }
    xmlFree(v);
    return s;
}

static mt_status read_system(ctx *c, xmlNodePtr root) {
    MT_TRY(read_packages(c, root));
    MT_TRY(read_cores(c, root));
    long long pus;
    MT_TRY(int_attr(c, root, "mt_pus", 0, 1 << 20, 0, &pus));
    c->t->n_pus = (size_t)pus;
    return MT_OK;
}

/* The note a report prints when some GPU's NVLink is unknown: the exporter's, else this file's. */
static mt_status nvlink_note(ctx *c, xmlNodePtr root) {
    size_t unknown = 0;
    for (size_t i = 0; i < c->t->n_gpus; i++) unknown += !c->t->gpus[i].nvlink_known;
    if (unknown == 0) return MT_OK;
    char *v = attr(root, "mt_nvlink_note");
    mt_status s = v && *v ? mt_topo_set_nvlink_note(c->t, "%s", v)
                          : mt_topo_set_nvlink_note(c->t, "NVLink unknown: topology file %s gives "
                                                    "no <gpu>/<nvlink> data for %zu GPU(s)",
                                                    c->path, unknown);
    xmlFree(v);
    return s;
}

static mt_status load_doc(ctx *c, xmlDocPtr doc) {
    xmlNodePtr root = xmlDocGetRootElement(doc);
    if (!is_elem(root, "system"))
        return mt_error(MT_ERR_INVALID_ARG,
                        "topology file %s: root element is <%s>, expected <system> (NCCL topology "
                        "XML)",
                        c->path, (const char *)root->name);
    MT_TRY(read_system(c, root));
    for (xmlNodePtr n = root->children; n; n = n->next) {
        if (!is_elem(n, "cpu")) continue;
        long long numa;
        MT_TRY(int_attr(c, n, "numaid", -1, NUMA_MAX_ID, -1, &numa));
        char *cpus = NULL;
        char *mask = attr(n, "affinity");
        mt_status s = mask ? parse_affinity(c, n, mask, &cpus) : MT_OK;
        xmlFree(mask);
        if (s == MT_OK && numa >= 0) s = mt_topo_add_cpuset(c->t, 0, (int)numa, cpus ? cpus : "");
        if (s == MT_OK && numa >= 0) s = read_cpu_id(c, n, &c->t->numa[c->t->n_numa - 1]);
        if (s == MT_OK) s = walk(c, n, -1, "", (int)numa, cpus ? cpus : "", 0);
        free(cpus);
        MT_TRY(s);
    }
    MT_TRY(check_links(c));
    MT_TRY(mt_topo_finish(c->t));
    return nvlink_note(c, root);
}

mt_status mt_topo_load_nccl_xml(const char *path, const char *buf, size_t len, mt_topo **out) {
    *out = NULL;
    xmlDocPtr doc;
    MT_TRY(mt_topo_xml_parse(path, buf, len, &doc));
    ctx c = {.path = path, .t = NULL};
    mt_status s = mt_topo_create(path, &c.t);
    if (s == MT_OK) s = load_doc(&c, doc);
    xmlFreeDoc(doc);
    if (s != MT_OK) {
        mt_topo_destroy(c.t);
        return s;
    }
    *out = c.t;
    return MT_OK;
}
