/* The topology model: growing arrays, the cpu list format, and loading a file of either format. */
#include "topo/topology.h"

#include "core/error.h"
#include "topo/topo_xml.h"

#include <meshtrain/log.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Grows *arr (element size elem) so that it holds at least n+1 elements. */
static mt_status grow(void **arr, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return MT_OK;
    size_t ncap = *cap ? *cap * 2 : 8;
    void *p = realloc(*arr, ncap * elem);
    if (!p) return mt_error(MT_ERR_OUT_OF_MEMORY, "topology: out of memory growing a table");
    memset((char *)p + *cap * elem, 0, (ncap - *cap) * elem);
    *arr = p;
    *cap = ncap;
    return MT_OK;
}

/* Capacities live beside the public struct so that mt_topo stays a plain description. */
typedef struct topo_impl {
    mt_topo pub;
    size_t cap_packages, cap_numa, cap_cores, cap_pci, cap_gpus, cap_nics, cap_switches;
} topo_impl;

static mt_status dup_str(const char *s, char **out) {
    *out = strdup(s ? s : "");
    return *out ? MT_OK : mt_error(MT_ERR_OUT_OF_MEMORY, "topology: out of memory copying a string");
}

static mt_status copy_busid(char dst[MT_TOPO_BUSID_MAX], const char *src) {
    size_t n = src ? strlen(src) : 0;
    if (n >= MT_TOPO_BUSID_MAX)
        return mt_error(MT_ERR_INVALID_ARG, "topology: PCI bus id '%.40s' is too long", src);
    for (size_t i = 0; i < n; i++)
        dst[i] = (src[i] >= 'A' && src[i] <= 'Z') ? (char)(src[i] - 'A' + 'a') : src[i];
    dst[n] = '\0';
    return MT_OK;
}

mt_status mt_topo_create(const char *source, mt_topo **out) {
    *out = NULL;
    topo_impl *impl = calloc(1, sizeof(*impl));
    if (!impl) return mt_error(MT_ERR_OUT_OF_MEMORY, "topology: out of memory");
    mt_status s = dup_str(source, &impl->pub.source);
    if (s != MT_OK) {
        free(impl);
        return s;
    }
    *out = &impl->pub;
    return MT_OK;
}

void mt_topo_destroy(mt_topo *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n_packages; i++) free(t->packages[i].cpus);
    for (size_t i = 0; i < t->n_numa; i++) free(t->numa[i].cpus);
    for (size_t i = 0; i < t->n_cores; i++) free(t->cores[i].cpus);
    free(t->cores);
    for (size_t i = 0; i < t->n_gpus; i++) {
        free(t->gpus[i].name);
        free(t->gpus[i].cpus);
        free(t->gpus[i].links);
    }
    for (size_t i = 0; i < t->n_nics; i++) free(t->nics[i].name);
    for (size_t i = 0; i < t->nvlink_bw_n; i++) free(t->nvlink_bw_labels[i]);
    free(t->nvlink_bw_labels);
    free(t->nvlink_bw);
    free(t->packages);
    free(t->numa);
    free(t->pci);
    free(t->gpus);
    free(t->nics);
    free(t->switches);
    free(t->nvlink_note);
    free(t->source);
    free((topo_impl *)t);
}

mt_status mt_topo_add_cpuset(mt_topo *t, int is_package, int id, const char *cpus) {
    topo_impl *impl = (topo_impl *)t;
    mt_topo_cpuset **arr = is_package ? &t->packages : &t->numa;
    size_t *n = is_package ? &t->n_packages : &t->n_numa;
    MT_TRY(grow((void **)arr, is_package ? &impl->cap_packages : &impl->cap_numa, *n,
                sizeof(**arr)));
    mt_topo_cpuset *c = &(*arr)[*n];
    memset(c, 0, sizeof(*c));
    c->id = id;
    c->cpu.family = c->cpu.model = -1;
    MT_TRY(dup_str(cpus, &c->cpus));
    (*n)++;
    return MT_OK;
}

const char *mt_topo_arch_nccl(const char *arch) {
    static const char *const names[][2] = {
        {"aarch64", "arm64"}, {"arm64", "arm64"},   {"ppc64le", "ppc64"},
        {"ppc64", "ppc64"},   {"x86_64", "x86_64"}, {"amd64", "x86_64"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(arch, names[i][0]) == 0) return names[i][1];
    return arch;
}

static mt_status copy_cpu_str(char dst[MT_TOPO_CPU_STR_MAX], const char *src, const char *what) {
    if (!src) return MT_OK;
    if (strlen(src) >= MT_TOPO_CPU_STR_MAX)
        return mt_error(MT_ERR_INVALID_ARG, "topology: CPU %s '%.40s' is longer than %d characters",
                        what, src, MT_TOPO_CPU_STR_MAX - 1);
    strcpy(dst, src);
    return MT_OK;
}

mt_status mt_topo_set_cpu_id(mt_topo_cpuset *set, const char *arch, const char *vendor, int family,
                             int model) {
    MT_TRY(copy_cpu_str(set->cpu.arch, arch ? mt_topo_arch_nccl(arch) : NULL, "architecture"));
    MT_TRY(copy_cpu_str(set->cpu.vendor, vendor, "vendor"));
    if (family >= 0) set->cpu.family = family;
    if (model >= 0) set->cpu.model = model;
    return MT_OK;
}

mt_status mt_topo_add_core(mt_topo *t, int numa, const char *cpus) {
    topo_impl *impl = (topo_impl *)t;
    MT_TRY(grow((void **)&t->cores, &impl->cap_cores, t->n_cores, sizeof(*t->cores)));
    mt_topo_cpuset *c = &t->cores[t->n_cores];
    memset(c, 0, sizeof(*c));
    c->id = numa;
    c->cpu.family = c->cpu.model = -1;
    MT_TRY(dup_str(cpus, &c->cpus));
    t->n_cores++;
    return MT_OK;
}

mt_status mt_topo_add_pci(mt_topo *t, const char *bus_id, mt_topo_pci_kind kind, int parent,
                          uint32_t pci_class, int numa, int *index_out) {
    topo_impl *impl = (topo_impl *)t;
    MT_TRY(grow((void **)&t->pci, &impl->cap_pci, t->n_pci, sizeof(*t->pci)));
    mt_topo_pci *p = &t->pci[t->n_pci];
    MT_TRY(copy_busid(p->bus_id, bus_id));
    p->kind = kind;
    p->parent = parent;
    p->pci_class = pci_class;
    p->numa = numa;
    p->link_speed[0] = '\0';
    p->link_width = -1;
    p->link_gbps = 0;
    if (index_out) *index_out = (int)t->n_pci;
    t->n_pci++;
    return MT_OK;
}

mt_status mt_topo_pci_set_link(mt_topo *t, int pci, const char *speed, int width, float gbps) {
    if (pci < 0 || (size_t)pci >= t->n_pci)
        return mt_error(MT_ERR_INVALID_ARG, "topology: no PCI entry %d to give a link", pci);
    mt_topo_pci *p = &t->pci[pci];
    if (speed && strlen(speed) >= MT_TOPO_LINK_SPEED_MAX)
        return mt_error(MT_ERR_INVALID_ARG,
                        "topology: PCI %s: link speed '%.40s' is longer than %d characters",
                        p->bus_id, speed, MT_TOPO_LINK_SPEED_MAX - 1);
    if (speed) strcpy(p->link_speed, speed);
    p->link_width = width;
    p->link_gbps = gbps;
    return MT_OK;
}

mt_status mt_topo_add_gpu(mt_topo *t, int index, const char *bus_id, const char *name, int numa,
                          const char *cpus, int pci, mt_topo_gpu **out) {
    topo_impl *impl = (topo_impl *)t;
    MT_TRY(grow((void **)&t->gpus, &impl->cap_gpus, t->n_gpus, sizeof(*t->gpus)));
    mt_topo_gpu *g = &t->gpus[t->n_gpus];
    memset(g, 0, sizeof(*g));
    MT_TRY(copy_busid(g->bus_id, bus_id));
    g->index = index;
    g->numa = numa;
    g->pci = pci;
    mt_status s = dup_str(name, &g->name);
    if (s == MT_OK) s = dup_str(cpus, &g->cpus);
    if (s != MT_OK) {
        free(g->name);
        free(g->cpus);
        memset(g, 0, sizeof(*g));
        return s;
    }
    t->n_gpus++;
    if (out) *out = g;
    return MT_OK;
}

mt_status mt_topo_gpu_add_link(mt_topo *t, mt_topo_gpu *gpu, const char *target,
                               mt_topo_link_kind kind, int count) {
    (void)t;
    mt_topo_nvlink *p = realloc(gpu->links, (gpu->n_links + 1) * sizeof(*p));
    if (!p) return mt_error(MT_ERR_OUT_OF_MEMORY, "topology: out of memory adding an NVLink");
    gpu->links = p;
    mt_topo_nvlink *l = &p[gpu->n_links];
    memset(l, 0, sizeof(*l));
    MT_TRY(copy_busid(l->target, target));
    l->kind = kind;
    l->count = count;
    gpu->n_links++;
    gpu->nvlink_known = 1;
    return MT_OK;
}

void mt_topo_gpu_clear_links(mt_topo_gpu *gpu) {
    free(gpu->links);
    gpu->links = NULL;
    gpu->n_links = 0;
    gpu->nvlink_known = 0;
}

void mt_topo_drop_gpu(mt_topo *t, size_t pos) {
    if (pos >= t->n_gpus) return;
    mt_topo_gpu *g = &t->gpus[pos];
    free(g->name);
    free(g->cpus);
    free(g->links);
    memmove(g, g + 1, (t->n_gpus - pos - 1) * sizeof(*g));
    t->n_gpus--;
    memset(&t->gpus[t->n_gpus], 0, sizeof(*g));
}

mt_status mt_topo_set_nvlink_note(mt_topo *t, const char *fmt, ...) {
    free(t->nvlink_note);
    t->nvlink_note = NULL;
    if (!fmt) return MT_OK;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&t->nvlink_note, fmt, ap);
    va_end(ap);
    if (n < 0) {
        t->nvlink_note = NULL;
        return mt_error(MT_ERR_OUT_OF_MEMORY, "topology: out of memory writing the NVLink note");
    }
    return MT_OK;
}

/* Reads up to max_digits hex digits; returns the number read (0: none). */
static int hex_field(const char **p, unsigned max_digits, unsigned long *out) {
    int n = 0;
    unsigned long v = 0;
    while (isxdigit((unsigned char)**p) && (unsigned)n < max_digits) {
        int c = tolower((unsigned char)**p);
        v = v * 16 + (unsigned long)(c <= '9' ? c - '0' : c - 'a' + 10);
        (*p)++;
        n++;
    }
    *out = v;
    return n;
}

mt_status mt_topo_busid_canon(const char *in, char out[MT_TOPO_BUSID_MAX]) {
    /* [domain:]bus:device.function, all hex; NVML pads the domain to 8 digits, CUDA to 4 */
    unsigned long f[4] = {0, 0, 0, 0};
    const char *p = in ? in : "";
    int colons = 0;
    for (const char *q = p; *q; q++) colons += *q == ':';
    int first = colons == 2 ? 0 : 1; /* without a domain the first field is the bus */
    mt_status bad = MT_OK;
    for (int i = first; i < 4 && bad == MT_OK; i++) {
        unsigned max = i == 0 ? 8 : i == 3 ? 1 : 2;
        if (hex_field(&p, max, &f[i]) == 0) bad = MT_ERR_INVALID_ARG;
        char sep = i < 2 ? ':' : i == 2 ? '.' : '\0';
        if (bad == MT_OK && *p != sep) bad = MT_ERR_INVALID_ARG;
        if (bad == MT_OK && sep) p++;
    }
    if (bad != MT_OK || (colons != 1 && colons != 2) || f[2] > 0x1f || f[3] > 7)
        return mt_error(MT_ERR_INVALID_ARG, "topology: '%.40s' is not a PCI bus id", in ? in : "");
    snprintf(out, MT_TOPO_BUSID_MAX, "%04lx:%02lx:%02lx.%lx", f[0], f[1], f[2], f[3]);
    return MT_OK;
}

mt_status mt_topo_add_nic(mt_topo *t, const char *name, const char *bus_id, int numa,
                          int64_t speed_mbps, int pci, int fabric) {
    topo_impl *impl = (topo_impl *)t;
    MT_TRY(grow((void **)&t->nics, &impl->cap_nics, t->n_nics, sizeof(*t->nics)));
    mt_topo_nic *n = &t->nics[t->n_nics];
    memset(n, 0, sizeof(*n));
    MT_TRY(copy_busid(n->bus_id, bus_id));
    MT_TRY(dup_str(name, &n->name));
    n->numa = numa;
    n->speed_mbps = speed_mbps;
    n->pci = pci;
    n->fabric = fabric != 0;
    t->n_nics++;
    return MT_OK;
}

mt_status mt_topo_add_switch(mt_topo *t, const char *bus_id, int pci) {
    topo_impl *impl = (topo_impl *)t;
    MT_TRY(grow((void **)&t->switches, &impl->cap_switches, t->n_switches, sizeof(*t->switches)));
    mt_topo_switch *w = &t->switches[t->n_switches];
    MT_TRY(copy_busid(w->bus_id, bus_id));
    w->pci = pci;
    t->n_switches++;
    return MT_OK;
}

static int cmp_busid(const void *a, const void *b) {
    const mt_topo_gpu *x = a, *y = b;
    return strcmp(x->bus_id, y->bus_id);
}

static int cmp_index(const void *a, const void *b) {
    const mt_topo_gpu *x = a, *y = b;
    return (x->index > y->index) - (x->index < y->index);
}

/* Keeps only fabric NICs when there are any (see mt_topo_nic.fabric), in their original order. */
static void keep_fabric_nics(mt_topo *t) {
    size_t fabric = 0;
    for (size_t i = 0; i < t->n_nics; i++) fabric += (size_t)t->nics[i].fabric;
    if (fabric == 0 || fabric == t->n_nics) return;
    size_t kept = 0;
    for (size_t i = 0; i < t->n_nics; i++) {
        if (t->nics[i].fabric) {
            t->nics[kept++] = t->nics[i];
        } else {
            mt_log(MT_LOG_DEBUG, "topology %s: network interface %s (%s) is not an RDMA/fabric "
                   "device; not listed as a NIC", t->source, t->nics[i].name, t->nics[i].bus_id);
            free(t->nics[i].name);
        }
    }
    t->n_nics = kept;
}

mt_status mt_topo_finish(mt_topo *t) {
    keep_fabric_nics(t);
    if (t->n_gpus == 0) return MT_OK; /* gpus may be NULL, which qsort must not be given */
    /* Bus order first, so that unindexed GPUs take the free indices in that order. */
    qsort(t->gpus, t->n_gpus, sizeof(*t->gpus), cmp_busid);
    for (size_t i = 0; i < t->n_gpus; i++) {
        if (t->gpus[i].index >= 0) continue;
        for (int cand = 0;; cand++) {
            int used = 0;
            for (size_t j = 0; j < t->n_gpus && !used; j++) used = t->gpus[j].index == cand;
            if (!used) {
                t->gpus[i].index = cand;
                break;
            }
        }
    }
    qsort(t->gpus, t->n_gpus, sizeof(*t->gpus), cmp_index);
    for (size_t i = 1; i < t->n_gpus; i++) {
        if (t->gpus[i].index == t->gpus[i - 1].index)
            return mt_error(MT_ERR_INVALID_ARG, "topology %s: GPUs %s and %s both have index %d",
                            t->source, t->gpus[i - 1].bus_id, t->gpus[i].bus_id, t->gpus[i].index);
    }
    for (size_t i = 0; i < t->n_gpus; i++) {
        for (size_t j = i + 1; j < t->n_gpus; j++) {
            if (strcmp(t->gpus[i].bus_id, t->gpus[j].bus_id) == 0)
                return mt_error(MT_ERR_INVALID_ARG, "topology %s: two GPUs have bus id %s",
                                t->source, t->gpus[i].bus_id);
        }
    }
    return MT_OK;
}

/* One decimal CPU number at *p, no sign or blank, at most max. */
static int read_cpu(const char **p, long max, long *out) {
    const char *s = *p;
    if (*s < '0' || *s > '9') return 0;
    long v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        v = v * 10 + (*s - '0');
        if (v > max) return 0;
    }
    *p = s;
    *out = v;
    return 1;
}

int mt_topo_cpulist_next(const char **p, long max, long *lo, long *hi) {
    const char *s = *p;
    if (!*s) return 0;
    if (!read_cpu(&s, max, lo)) return -1;
    *hi = *lo;
    if (*s == '-') {
        s++;
        if (!read_cpu(&s, max, hi) || *hi < *lo) return -1;
    }
    if (*s == ',') s++;
    else if (*s) return -1;
    *p = s;
    return 1;
}

mt_status mt_topo_cpulist_parse(const char *list, uint32_t *words, size_t n_words, int *max_cpu) {
    memset(words, 0, n_words * sizeof(*words));
    *max_cpu = -1;
    long lo, hi, max = n_words ? (long)(n_words * 32 - 1) : -1;
    int r;
    for (const char *p = list; (r = mt_topo_cpulist_next(&p, max, &lo, &hi)) > 0;) {
        for (long c = lo; c <= hi; c++) words[c / 32] |= 1u << (c % 32);
        if (hi > *max_cpu) *max_cpu = (int)hi;
    }
    if (r == 0) return MT_OK;
    return mt_error(MT_ERR_INVALID_ARG, "cpu list '%.80s' is not a list of CPU numbers below %zu",
                    list, n_words * 32);
}

mt_status mt_topo_cpulist_shift(const char *list, int k, char *out, size_t size) {
    size_t len = 0;
    long lo, hi;
    int r;
    out[0] = '\0';
    const char *p = list;
    while ((r = mt_topo_cpulist_next(&p, MT_TOPO_CPUS_MAX - 1, &lo, &hi)) > 0) {
        if (lo + k < 0 || hi + k >= MT_TOPO_CPUS_MAX) break;
        int w = lo == hi ? snprintf(out + len, size - len, "%s%ld", len ? "," : "", lo + k)
                         : snprintf(out + len, size - len, "%s%ld-%ld", len ? "," : "", lo + k,
                                    hi + k);
        if (w < 0 || (size_t)w >= size - len) break;
        len += (size_t)w;
    }
    if (r == 0) return MT_OK;
    return mt_error(MT_ERR_INVALID_ARG, "cpu list '%.80s' cannot be shifted by %d (CPUs below %d)",
                    list, k, MT_TOPO_CPUS_MAX);
}

mt_status mt_topo_cpulist(const uint32_t *words, size_t n_words, char **out) {
    size_t nbits = n_words * 32, cap = 64, len = 0;
    char *s = malloc(cap);
    if (!s) return mt_error(MT_ERR_OUT_OF_MEMORY, "topology: out of memory formatting a cpu list");
    s[0] = '\0';
    for (size_t i = 0; i < nbits;) {
        if (!(words[i / 32] >> (i % 32) & 1u)) {
            i++;
            continue;
        }
        size_t j = i;
        while (j + 1 < nbits && (words[(j + 1) / 32] >> ((j + 1) % 32) & 1u)) j++;
        char item[48];
        int k = j == i ? snprintf(item, sizeof(item), "%s%zu", len ? "," : "", i)
                       : snprintf(item, sizeof(item), "%s%zu-%zu", len ? "," : "", i, j);
        if (len + (size_t)k + 1 > cap) {
            while (len + (size_t)k + 1 > cap) cap *= 2;
            char *p = realloc(s, cap);
            if (!p) {
                free(s);
                return mt_error(MT_ERR_OUT_OF_MEMORY, "topology: out of memory formatting a cpu list");
            }
            s = p;
        }
        memcpy(s + len, item, (size_t)k + 1);
        len += (size_t)k;
        i = j + 1;
    }
    *out = s;
    return MT_OK;
}

/* Reads a whole regular file no larger than MT_TOPO_FILE_MAX into a NUL-terminated buffer. */
static mt_status read_file(const char *path, char **buf_out, size_t *len_out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return mt_error_errno(e == ENOENT ? MT_ERR_NOT_FOUND : MT_ERR_IO, e,
                              "topology file %s cannot be opened", path);
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mt_error_errno(MT_ERR_IO, e, "topology file %s cannot be examined", path);
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return mt_error(MT_ERR_INVALID_ARG, "topology file %s is a directory, not a file", path);
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > MT_TOPO_FILE_MAX) {
        close(fd);
        return mt_error(MT_ERR_INVALID_ARG,
                        "topology file %s is not a regular file of at most %zu MiB", path,
                        MT_TOPO_FILE_MAX >> 20);
    }
    size_t len = (size_t)st.st_size, got = 0;
    char *buf = malloc(len + 1);
    if (!buf) {
        close(fd);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "topology file %s: out of memory reading it", path);
    }
    while (got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return mt_error_errno(MT_ERR_IO, e, "topology file %s cannot be read", path);
        }
        got += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    *buf_out = buf;
    *len_out = len;
    return MT_OK;
}

mt_status mt_topo_load_file(const char *path, mt_topo **out) {
    *out = NULL;
    if (!path || !*path)
        return mt_error(MT_ERR_INVALID_ARG, "topology: no file name given");
    char *buf = NULL;
    size_t len = 0;
    MT_TRY(read_file(path, &buf, &len));
    char root[32];
    mt_status s = mt_topo_xml_root(path, buf, len, root, sizeof(root));
    if (s == MT_OK) {
        if (strcmp(root, "system") == 0) {
            s = mt_topo_load_nccl_xml(path, buf, len, out);
        } else if (strcmp(root, "topology") == 0) {
            s = mt_topo_load_hwloc_xml(path, buf, len, out);
        } else {
            s = mt_error(MT_ERR_INVALID_ARG,
                         "topology file %s: root element is <%s>, expected <topology> (hwloc XML) "
                         "or <system> (NCCL topology XML)",
                         path, root);
        }
    }
    free(buf);
    return s;
}
