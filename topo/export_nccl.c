/* Writes a topology as an NCCL topology XML (the NCCL_TOPO_FILE format), in the subset of XML
 * that NCCL's own hand-written parser reads: no declaration, no comments, attributes separated by
 * one space, values in double quotes of at most 253 characters, indentation with spaces.
 *
 * NCCL reads what it needs and fills the rest from the machine it runs on, so only what the model
 * knows is written (see docs/mt-topo.md, "The NCCL export"): a <cpu>'s arch/vendor/familyid/
 * modelid where the source gave them (nothing is guessed: a <cpu> holding NICs without them draws
 * a warning, since NCCL then may stop on it), PCI link speed and width as the source gave them or
 * derived from hwloc's link rate, else empty (NCCL's own value for "unknown"), <gpu> gets dev but
 * not sm/rank/gdr, <net> gets name and speed. Facts NCCL's format cannot hold travel in
 * attributes NCCL ignores, all named mt_*: packages, cores and PUs (<system>), the host bridge
 * above a top-level <pci> (so that PHB survives: NCCL's format makes devices under different
 * top-level <pci> of a <cpu> NODE), hwloc's link rate (<pci>), a GPU's name and "NVLink unknown"
 * (<gpu>). topo/topo_nccl_xml.c reads them back. */
#include "topo/report.h"

#include "core/error.h"

#include <meshtrain/log.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NCCL_VALUE_MAX 253   /* NCCL's parser rejects longer attribute values */
#define NCCL_NODES_MAX 256   /* NCCL_TOPO_XML_MAX_NODES: elements NCCL keeps in one topology */
#define HIDDEN_SWITCH "fffffff:ff:ff.0"

typedef struct writer {
    FILE *out;
    const mt_topo *t;
    mt_status err;
    int depth;
    size_t elements;
    char *keep;       /* pci[] entries written: ancestors of GPUs, NICs and switches */
    char *placed;     /* pci[] top-level entries already written under a <cpu> */
    size_t nets;      /* <net> elements written so far */
    char unknown_cpus[256]; /* "0 (arch), 1 (vendor)": <cpu>s with NICs NCCL cannot use as is */
    const char *first_missing; /* the attribute NCCL's error would name for the first of them */
} writer;

static void indent(writer *w) {
    for (int i = 0; i < w->depth; i++) fputs("  ", w->out);
}

static void open_tag(writer *w, const char *name) {
    indent(w);
    fprintf(w->out, "<%s", name);
    w->elements++;
}

/* One attribute, XML-escaped; a value NCCL cannot read fails the export. */
static void attr(writer *w, const char *key, const char *value) {
    if (w->err != MT_OK) return;
    size_t len = 0;
    for (const char *p = value; *p; p++)
        len += *p == '&' ? 5 : (*p == '<' || *p == '>') ? 4 : *p == '"' ? 6 : 1;
    if (len > NCCL_VALUE_MAX) {
        w->err = mt_error(MT_ERR_INVALID_ARG,
                          "NCCL export: attribute %s is %zu characters long; NCCL reads at most "
                          "%d ('%.40s...')",
                          key, len, NCCL_VALUE_MAX, value);
        return;
    }
    fprintf(w->out, " %s=\"", key);
    for (const char *p = value; *p; p++) {
        if (*p == '&') fputs("&amp;", w->out);
        else if (*p == '<') fputs("&lt;", w->out);
        else if (*p == '>') fputs("&gt;", w->out);
        else if (*p == '"') fputs("&quot;", w->out);
        else fputc(*p, w->out);
    }
    fputc('"', w->out);
}

static void attr_int(writer *w, const char *key, long long v) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%lld", v);
    attr(w, key, buf);
}

static void attr_class(writer *w, const char *key, uint32_t cls) {
    char buf[16];
    snprintf(buf, sizeof(buf), "0x%06x", (unsigned)cls);
    attr(w, key, buf);
}

/* An attribute NCCL ignores: dropped with a warning when too long, since the file stays valid
 * for NCCL without it. */
static void mt_attr(writer *w, const char *key, const char *value) {
    if (strlen(value) > NCCL_VALUE_MAX) {
        mt_log(MT_LOG_WARN,
               "NCCL export: %s (%zu characters) exceeds NCCL's %d-character attribute limit and "
               "is left out; reading the file back will not show it",
               key, strlen(value), NCCL_VALUE_MAX);
        return;
    }
    attr(w, key, value);
}

/* "0-23,48-71" as NCCL's affinity: 32-bit hex words, most significant first. */
static void attr_affinity(writer *w, const char *cpus) {
    if (w->err != MT_OK || !*cpus) return;
    uint32_t *words = calloc(MT_TOPO_CPUS_MAX / 32, sizeof(*words));
    if (!words) {
        w->err = mt_error(MT_ERR_OUT_OF_MEMORY, "NCCL export: out of memory");
        return;
    }
    int max_cpu;
    mt_status s = mt_topo_cpulist_parse(cpus, words, MT_TOPO_CPUS_MAX / 32, &max_cpu);
    if (s != MT_OK) {
        w->err = mt_error_wrap(s, "NCCL export");
    } else if (max_cpu >= 0) {
        size_t n = (size_t)max_cpu / 32 + 1;
        char *mask = malloc(n * 9 + 1);
        if (!mask) {
            w->err = mt_error(MT_ERR_OUT_OF_MEMORY, "NCCL export: out of memory");
        } else {
            char *p = mask;
            for (size_t i = n; i-- > 0;) p += sprintf(p, "%08x%s", (unsigned)words[i], i ? "," : "");
            attr(w, "affinity", mask);
            free(mask);
        }
    }
    free(words);
}

/* The CPU identity the source gave; NCCL fills a missing attribute itself only from the machine it
 * runs on, and only for a <cpu> it reaches through a GPU (see cpu_id_missing). */
static void attr_cpu_id(writer *w, const mt_topo_cpu_id *id) {
    if (!id) return;
    if (*id->arch) attr(w, "arch", id->arch);
    if (*id->vendor) attr(w, "vendor", id->vendor);
    if (id->family >= 0) attr_int(w, "familyid", id->family);
    if (id->model >= 0) attr_int(w, "modelid", id->model);
}

/* The first <cpu> attribute NCCL's topology builder requires that id lacks (arch; on x86 the
 * vendor; for Intel and Zhaoxin also familyid and modelid), or NULL when none is missing. */
static const char *cpu_id_missing(const mt_topo_cpu_id *id) {
    if (!id || !*id->arch) return "arch";
    if (strcmp(id->arch, "x86_64") != 0) return NULL;
    if (!*id->vendor) return "vendor";
    int by_model = strcmp(id->vendor, "GenuineIntel") == 0 ||
                   strcmp(id->vendor, "CentaurHauls") == 0 ||
                   strcmp(id->vendor, "  Shanghai  ") == 0;
    if (by_model && id->family < 0) return "familyid";
    if (by_model && id->model < 0) return "modelid";
    return NULL;
}

static const mt_topo_cpu_id *numa_cpu_id(const mt_topo *t, int numa) {
    for (size_t i = 0; i < t->n_numa; i++)
        if (t->numa[i].id == numa) return &t->numa[i].cpu;
    return NULL;
}

/* NCCL's PCIe rate names and each one's data rate per lane in GB/s, as hwloc computes it (8b/10b
 * coding up to 5 GT/s, 128b/130b up to 32 GT/s, 242/256 FLIT at 64 GT/s). */
static const struct {
    const char *speed;
    double lane_gbps;
} pcie_rates[] = {
    {"2.5 GT/s PCIe", 2.5 * 8 / 10 / 8},        {"5.0 GT/s PCIe", 5.0 * 8 / 10 / 8},
    {"8.0 GT/s PCIe", 8.0 * 128 / 130 / 8},     {"16.0 GT/s PCIe", 16.0 * 128 / 130 / 8},
    {"32.0 GT/s PCIe", 32.0 * 128 / 130 / 8},   {"64.0 GT/s PCIe", 64.0 * 242 / 256 / 8},
};

/* A rate x width pair giving hwloc's link rate, x16 tried first. Pairs with the same total give
 * NCCL the same bandwidth (it multiplies the two), so the choice does not change its paths; the
 * lane count itself is not claimed (mt_link_gbps marks the pair as derived). */
static int link_from_rate(double gbps, const char **speed, int *width) {
    static const int widths[] = {16, 8, 4, 2, 1, 32};
    for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++) {
        for (size_t r = 0; r < sizeof(pcie_rates) / sizeof(pcie_rates[0]); r++) {
            double lane = pcie_rates[r].lane_gbps;
            if (fabs(gbps / widths[i] - lane) <= lane * 0.002) {
                *speed = pcie_rates[r].speed;
                *width = widths[i];
                return 1;
            }
        }
    }
    return 0;
}

/* link_speed and link_width, which NCCL requires on every <pci> it keeps ("" = unknown: NCCL then
 * assumes 8 GT/s x16). */
static void attr_link(writer *w, const mt_topo_pci *p) {
    if (*p->link_speed || p->link_width >= 0 || p->link_gbps <= 0) {
        attr(w, "link_speed", p->link_speed);
        if (p->link_width >= 0) attr_int(w, "link_width", p->link_width);
        else attr(w, "link_width", "");
        return;
    }
    const char *speed = "";
    int width = -1;
    link_from_rate(p->link_gbps, &speed, &width);
    attr(w, "link_speed", speed);
    if (width >= 0) attr_int(w, "link_width", width);
    else attr(w, "link_width", "");
    char buf[32];
    snprintf(buf, sizeof(buf), "%.9g", (double)p->link_gbps); /* exact for a float */
    attr(w, "mt_link_gbps", buf);
}

/* Marks each entry that is, or is above, a GPU, NIC or switch; bounded against loops. */
static void mark(writer *w, int pci) {
    for (size_t steps = 0; pci >= 0 && (size_t)pci < w->t->n_pci && steps <= w->t->n_pci; steps++) {
        w->keep[pci] = 1;
        pci = w->t->pci[pci].parent;
    }
}

static int is_host_bridge(const mt_topo *t, int i) {
    return i >= 0 && (size_t)i < t->n_pci && t->pci[i].kind == MT_TOPO_PCI_HOST_BRIDGE;
}

/* A top-level <pci>: an entry without a parent, or whose parent is a host bridge. */
static int is_top(const mt_topo *t, size_t i) {
    return t->pci[i].kind != MT_TOPO_PCI_HOST_BRIDGE &&
           (t->pci[i].parent < 0 || is_host_bridge(t, t->pci[i].parent));
}

static int top_of(const mt_topo *t, int pci) {
    for (size_t steps = 0; pci >= 0 && steps <= t->n_pci; steps++) {
        if (is_top(t, (size_t)pci)) return pci;
        pci = t->pci[pci].parent;
    }
    return -1;
}

static uint32_t gpu_class_of(const mt_topo *t, const char *busid) {
    for (size_t i = 0; i < t->n_gpus; i++)
        if (strcmp(t->gpus[i].bus_id, busid) == 0 && t->gpus[i].pci >= 0)
            return t->pci[t->gpus[i].pci].pci_class;
    return 0x030200;
}

static void write_gpu(writer *w, const mt_topo_gpu *g) {
    open_tag(w, "gpu");
    attr_int(w, "dev", g->index);
    unsigned vendor, device;
    char tail;
    if (sscanf(g->name, "PCI %4x:%4x%c", &vendor, &device, &tail) != 2) mt_attr(w, "mt_name", g->name);
    if (!g->nvlink_known) attr(w, "mt_nvlink", "unknown");
    if (g->n_links == 0) {
        fputs("/>\n", w->out);
        return;
    }
    fputs(">\n", w->out);
    w->depth++;
    for (size_t i = 0; i < g->n_links; i++) {
        const mt_topo_nvlink *l = &g->links[i];
        open_tag(w, "nvlink");
        switch (l->kind) {
        case MT_TOPO_LINK_SWITCH:
            attr(w, "target", strcmp(l->target, "switch") == 0 ? HIDDEN_SWITCH : l->target);
            attr_int(w, "count", l->count);
            attr_class(w, "tclass", 0x068000);
            break;
        case MT_TOPO_LINK_OTHER: /* the CPU (POWER8/9), NCCL's class for it */
            attr(w, "target", l->target);
            attr_int(w, "count", l->count);
            attr_class(w, "tclass", 0x068001);
            break;
        default: /* a GPU, or the GPU itself as the source file had it */
            attr(w, "target", l->target);
            attr_int(w, "count", l->count);
            attr_class(w, "tclass", gpu_class_of(w->t, l->target));
            break;
        }
        fputs("/>\n", w->out);
    }
    w->depth--;
    indent(w);
    fputs("</gpu>\n", w->out);
}

/* The <nic> of PCI entry pci, or with pci < 0 the NICs without a PCI entry on NUMA node numa. */
static void write_nets(writer *w, int pci, int numa) {
    const mt_topo *t = w->t;
    int opened = 0;
    for (size_t i = 0; i < t->n_nics; i++) {
        const mt_topo_nic *c = &t->nics[i];
        if (c->pci != pci || (pci < 0 && c->numa != numa) || !*c->name) continue;
        if (!opened) {
            open_tag(w, "nic");
            fputs(">\n", w->out);
            w->depth++;
            opened = 1;
        }
        open_tag(w, "net");
        attr(w, "name", c->name);
        if (c->speed_mbps >= 0) attr_int(w, "speed", c->speed_mbps);
        fputs("/>\n", w->out);
        w->nets++;
    }
    if (opened) {
        w->depth--;
        indent(w);
        fputs("</nic>\n", w->out);
    }
}

static int has_children(writer *w, int pci) {
    const mt_topo *t = w->t;
    for (size_t i = 0; i < t->n_pci; i++)
        if (w->keep[i] && t->pci[i].parent == pci) return 1;
    for (size_t i = 0; i < t->n_gpus; i++)
        if (t->gpus[i].pci == pci) return 1;
    for (size_t i = 0; i < t->n_nics; i++)
        if (t->nics[i].pci == pci && *t->nics[i].name) return 1;
    return 0;
}

static void write_pci(writer *w, int pci, int depth_left) {
    const mt_topo *t = w->t;
    const mt_topo_pci *p = &t->pci[pci];
    if (depth_left <= 0) {
        if (w->err == MT_OK)
            w->err = mt_error(MT_ERR_INVALID_ARG, "NCCL export: PCI tree deeper than 32 levels");
        return;
    }
    open_tag(w, "pci");
    attr(w, "busid", p->bus_id);
    attr_class(w, "class", p->pci_class);
    const mt_topo_gpu *gpu = NULL;
    for (size_t i = 0; i < t->n_gpus && !gpu; i++)
        if (t->gpus[i].pci == pci) gpu = &t->gpus[i];
    unsigned vendor, device;
    char tail;
    if (gpu && sscanf(gpu->name, "PCI %4x:%4x%c", &vendor, &device, &tail) == 2) {
        char buf[16];
        snprintf(buf, sizeof(buf), "0x%04x", vendor);
        attr(w, "vendor", buf);
        snprintf(buf, sizeof(buf), "0x%04x", device);
        attr(w, "device", buf);
    }
    attr_link(w, p);
    if (is_host_bridge(t, p->parent)) attr(w, "mt_host_bridge", t->pci[p->parent].bus_id);
    if (!has_children(w, pci)) {
        fputs("/>\n", w->out);
        return;
    }
    fputs(">\n", w->out);
    w->depth++;
    if (gpu) write_gpu(w, gpu);
    write_nets(w, pci, -1);
    for (size_t i = 0; i < t->n_pci && w->err == MT_OK; i++)
        if (w->keep[i] && t->pci[i].parent == pci) write_pci(w, (int)i, depth_left - 1);
    w->depth--;
    indent(w);
    fputs("</pci>\n", w->out);
}

/* The NUMA node and CPUs of the <cpu> a top-level <pci> belongs under: those of a GPU below it,
 * else the node's own. */
static void top_place(const mt_topo *t, int top, int *numa, const char **cpus) {
    for (size_t i = 0; i < t->n_gpus; i++) {
        if (top_of(t, t->gpus[i].pci) == top) {
            *numa = t->gpus[i].numa;
            *cpus = t->gpus[i].cpus;
            return;
        }
    }
    *numa = t->pci[top].numa;
    *cpus = NULL; /* any <cpu> of that node */
}

static int same_place(const mt_topo *t, int top, int numa, const char *cpus) {
    int n;
    const char *c;
    top_place(t, top, &n, &c);
    return n == numa && (!c || strcmp(c, cpus) == 0);
}

/* Notes a <cpu> holding NICs whose identity lacks what NCCL needs, for one warning at the end. */
static void note_unknown_cpu(writer *w, int numa, const char *missing) {
    size_t len = strlen(w->unknown_cpus);
    char item[64];
    if (numa >= 0) snprintf(item, sizeof(item), "%s%d (%s)", len ? ", " : "", numa, missing);
    else snprintf(item, sizeof(item), "%sunknown (%s)", len ? ", " : "", missing);
    if (len + strlen(item) + 4 < sizeof(w->unknown_cpus)) strcat(w->unknown_cpus, item);
    else if (!strstr(w->unknown_cpus, "...")) strcat(w->unknown_cpus, "...");
}

/* Writes one <cpu> with the top-level trees that belong there (and NICs without PCI). */
static void write_cpu(writer *w, int numa, const char *cpus, const mt_topo_cpu_id *id) {
    const mt_topo *t = w->t;
    size_t nets = w->nets;
    open_tag(w, "cpu");
    attr_int(w, "numaid", numa);
    attr_affinity(w, cpus);
    attr_cpu_id(w, id);
    fputs(">\n", w->out);
    w->depth++;
    for (size_t i = 0; i < t->n_pci && w->err == MT_OK; i++) {
        if (!w->keep[i] || w->placed[i] || !is_top(t, i) || !same_place(t, (int)i, numa, cpus))
            continue;
        w->placed[i] = 1;
        write_pci(w, (int)i, 32);
    }
    write_nets(w, -1, numa);
    w->depth--;
    indent(w);
    fputs("</cpu>\n", w->out);
    const char *missing = cpu_id_missing(id);
    if (w->nets > nets && missing) {
        note_unknown_cpu(w, numa, missing);
        if (!w->first_missing) w->first_missing = missing;
    }
}

/* "id:cpus;..." for packages. */
static char *packages_attr(const mt_topo *t) {
    size_t len = 1;
    for (size_t i = 0; i < t->n_packages; i++) len += strlen(t->packages[i].cpus) + 16;
    char *s = malloc(len), *p = s;
    if (!s) return NULL;
    *p = '\0';
    for (size_t i = 0; i < t->n_packages; i++)
        p += sprintf(p, "%s%d:%s", i ? ";" : "", t->packages[i].id, t->packages[i].cpus);
    return s;
}

/* Cores as "numa:pus" items; a run of cores each of whose PUs are the previous core's plus one
 * is written once as "numa:pus*count" (cores 0-47 with PUs {c, c+48} are "0:0,48*48"). */
static char *cores_attr(const mt_topo *t) {
    size_t len = 1;
    for (size_t i = 0; i < t->n_cores; i++) len += strlen(t->cores[i].cpus) + 32;
    char *s = malloc(len), *p = s;
    char shifted[256];
    if (!s) return NULL;
    *p = '\0';
    for (size_t i = 0; i < t->n_cores;) {
        const mt_topo_cpuset *c = &t->cores[i];
        size_t run = 1;
        while (i + run < t->n_cores && t->cores[i + run].id == c->id &&
               mt_topo_cpulist_shift(c->cpus, (int)run, shifted, sizeof(shifted)) == MT_OK &&
               strcmp(shifted, t->cores[i + run].cpus) == 0)
            run++;
        p += sprintf(p, "%s%d:%s", i ? ";" : "", c->id, c->cpus);
        if (run > 1) p += sprintf(p, "*%zu", run);
        i += run;
    }
    /* A core list that does not shift is written plainly, not an error. */
    mt_error_clear_message();
    return s;
}

static void write_system(writer *w) {
    const mt_topo *t = w->t;
    open_tag(w, "system");
    attr(w, "version", "1");
    char *pk = t->n_packages ? packages_attr(t) : NULL;
    char *co = t->n_cores ? cores_attr(t) : NULL;
    if ((t->n_packages && !pk) || (t->n_cores && !co))
        w->err = mt_error(MT_ERR_OUT_OF_MEMORY, "NCCL export: out of memory");
    if (pk) mt_attr(w, "mt_packages", pk);
    if (co) mt_attr(w, "mt_cores", co);
    if (t->n_pus) attr_int(w, "mt_pus", (long long)t->n_pus);
    if (t->nvlink_note && mt_topo_nvlink_unknown_reason(t)) mt_attr(w, "mt_nvlink_note", t->nvlink_note);
    free(pk);
    free(co);
    fputs(">\n", w->out);
    w->depth++;
    /* one <cpu> per NUMA node, in the model's order, so that reading back lists the same nodes */
    for (size_t i = 0; i < t->n_numa && w->err == MT_OK; i++)
        write_cpu(w, t->numa[i].id, t->numa[i].cpus, &t->numa[i].cpu);
    /* trees whose GPUs sit on another CPU set (a package or the machine: NUMA unknown) */
    for (size_t i = 0; i < t->n_pci && w->err == MT_OK; i++) {
        if (!w->keep[i] || w->placed[i] || !is_top(t, i)) continue;
        int numa;
        const char *cpus;
        top_place(t, (int)i, &numa, &cpus);
        if (numa >= 0)
            mt_log(MT_LOG_WARN, "NCCL export: PCI tree %s sits on NUMA node %d with CPUs %s, "
                   "which differ from the node's; it is written with CPUs of its own",
                   t->pci[i].bus_id, numa, cpus ? cpus : "");
        write_cpu(w, numa, cpus ? cpus : "", numa_cpu_id(t, numa));
    }
    w->depth--;
    fputs("</system>\n", w->out);
}

static mt_status render(const mt_topo *t, FILE *out);

mt_status mt_topo_export_nccl(const mt_topo *t, FILE *out) {
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    if (!mem) return mt_error(MT_ERR_OUT_OF_MEMORY, "NCCL export: out of memory");
    mt_status s = render(t, mem);
    if (fclose(mem) != 0 && s == MT_OK) s = mt_error(MT_ERR_OUT_OF_MEMORY, "NCCL export: out of memory");
    /* written only when whole, so that a failed export leaves no half file on stdout */
    if (s == MT_OK && (fwrite(buf, 1, len, out) != len || fflush(out) != 0 || ferror(out)))
        s = mt_error(MT_ERR_IO, "NCCL export: writing failed");
    free(buf);
    return s;
}

static mt_status render(const mt_topo *t, FILE *out) {
    writer w = {.out = out, .t = t};
    w.keep = calloc(t->n_pci ? t->n_pci : 1, 1);
    w.placed = calloc(t->n_pci ? t->n_pci : 1, 1);
    if (!w.keep || !w.placed) {
        free(w.keep);
        free(w.placed);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "NCCL export: out of memory");
    }
    for (size_t i = 0; i < t->n_gpus; i++) mark(&w, t->gpus[i].pci);
    for (size_t i = 0; i < t->n_nics; i++) mark(&w, t->nics[i].pci);
    for (size_t i = 0; i < t->n_switches; i++) mark(&w, t->switches[i].pci);
    for (size_t i = 0; i < t->n_gpus; i++)
        if (t->gpus[i].pci < 0) {
            free(w.keep);
            free(w.placed);
            return mt_error(MT_ERR_UNSUPPORTED, "NCCL export: GPU %s has no PCI entry",
                            t->gpus[i].bus_id);
        }
    write_system(&w);
    free(w.keep);
    free(w.placed);
    if (w.err != MT_OK) return w.err;
    if (w.first_missing)
        mt_log(MT_LOG_WARN,
               "NCCL export: %s gives no complete CPU identity for NUMA node(s) %s, whose <cpu> "
               "holds NICs; it is written without the missing attributes (a guess would be "
               "wrong on some machine). NCCL fills them only from the machine it runs on, and "
               "only for a <cpu> it reaches through one of its GPUs: a job using such a NIC "
               "without a GPU on that NUMA node stops with \"Attribute %s of node cpu not found\"",
               t->source, w.unknown_cpus, w.first_missing);
    if (w.elements > NCCL_NODES_MAX)
        mt_log(MT_LOG_WARN, "NCCL export: the file has %zu elements; NCCL keeps at most %d per "
               "topology and may refuse it", w.elements, NCCL_NODES_MAX);
    return MT_OK;
}

mt_status mt_topo_export_nccl_file(const mt_topo *t, const char *path, FILE *out_stdout) {
    if (strcmp(path, "-") == 0) return mt_topo_export_nccl(t, out_stdout);
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp) return mt_error(MT_ERR_OUT_OF_MEMORY, "NCCL export to %s: out of memory", path);
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        int e = errno;
        free(tmp);
        return mt_error_errno(MT_ERR_IO, e, "NCCL export: cannot create %s", path);
    }
    mt_status s = mt_topo_export_nccl(t, f);
    if (fclose(f) != 0 && s == MT_OK) s = mt_error_errno(MT_ERR_IO, errno, "NCCL export: writing %s failed", path);
    if (s == MT_OK && rename(tmp, path) != 0)
        s = mt_error_errno(MT_ERR_IO, errno, "NCCL export: cannot write %s", path);
    if (s != MT_OK) {
        unlink(tmp);
        if (s != MT_ERR_IO) mt_error_wrap(s, "NCCL export to %s", path);
    }
    free(tmp);
    return s;
}
