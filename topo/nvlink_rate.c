/* NVLink counts from hwloc's NVLinkBandwidth matrix (see topo/nvlink_rate.h).
 *
 * What hwloc writes (its NVML backend, hwloc/topology-nvml.c): for each active link of each GPU,
 * a unidirectional per-link bandwidth in MB/s chosen from the link's NVML version: 20000 for
 * NVLink 1.0 (P100), 25000 for 2.x, 3.x and 4.0 (V100, A100, H100/H200), 50000 for 5.0
 * (Blackwell). A GPU-GPU pair is counted once per link and written on both sides of the
 * diagonal; a link into an NVSwitch or a POWER CPU appears in the GPU's row and column. The
 * diagonal holds an artificial 1000000 ("local is faster"), or 0 in older files. hwloc releases
 * before 2.12 did not know NVML's version numbers for H100 and Blackwell and wrote no value for
 * them, so files with such GPUs usually carry no matrix at all; the rate table still covers them
 * for files from newer hwloc. The generation is not in the file, hence the model-name table. */
#include "topo/nvlink_rate.h"

#include "core/error.h"

#include <meshtrain/log.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct model_rate {
    const char *token; /* a word of the model name, compared without case */
    int generation;
    uint64_t mbps;
} model_rate;

/* Data-centre and workstation GPUs with NVLink, by marketing name and by chip name (PCI database
 * names such as "GA100 [A100 SXM4 40GB]" are used when no GPU OS device names the model). */
static const model_rate rates[] = {
    {"P100", 1, 20000},  {"GP100", 1, 20000},
    {"V100", 2, 25000},  {"GV100", 2, 25000},
    {"A100", 3, 25000},  {"A800", 3, 25000},  {"A30", 3, 25000},   {"A40", 3, 25000},
    {"A6000", 3, 25000}, {"GA100", 3, 25000},
    {"H100", 4, 25000},  {"H800", 4, 25000},  {"H200", 4, 25000},  {"H20", 4, 25000},
    {"GH200", 4, 25000}, {"GH100", 4, 25000},
    {"B100", 5, 50000},  {"B200", 5, 50000},  {"B300", 5, 50000},  {"GB200", 5, 50000},
    {"GB300", 5, 50000}, {"GB100", 5, 50000},
};

uint64_t mt_topo_nvlink_rate(const char *gpu_name, int *generation) {
    if (generation) *generation = 0;
    if (!gpu_name) return 0;
    /* Words are runs of letters and digits: "A100-SXM4-40GB" gives A100, SXM4, 40GB. */
    for (const char *p = gpu_name; *p;) {
        while (*p && !isalnum((unsigned char)*p)) p++;
        const char *w = p;
        while (*p && isalnum((unsigned char)*p)) p++;
        size_t len = (size_t)(p - w);
        for (size_t i = 0; len && i < sizeof(rates) / sizeof(rates[0]); i++) {
            if (strlen(rates[i].token) == len && strncasecmp(w, rates[i].token, len) == 0) {
                if (generation) *generation = rates[i].generation;
                return rates[i].mbps;
            }
        }
    }
    return 0;
}

static int find_label(const mt_topo *t, const char *busid) {
    for (size_t i = 0; i < t->nvlink_bw_n; i++)
        if (t->nvlink_bw_labels[i] && strcasecmp(t->nvlink_bw_labels[i], busid) == 0) return (int)i;
    return -1;
}

static mt_topo_link_kind label_kind(const mt_topo *t, const char *label) {
    for (size_t i = 0; i < t->n_gpus; i++)
        if (strcasecmp(t->gpus[i].bus_id, label) == 0) return MT_TOPO_LINK_GPU;
    for (size_t i = 0; i < t->n_switches; i++)
        if (strcasecmp(t->switches[i].bus_id, label) == 0) return MT_TOPO_LINK_SWITCH;
    return MT_TOPO_LINK_OTHER;
}

/* What one conversion has already said, so that each problem is reported once. */
typedef struct conv {
    mt_topo *t;
    const char **warned_models;
    size_t n_warned;
    size_t inexact;          /* entries rounded */
    char inexact_first[160]; /* the first of them, for the warning */
    char note[256];          /* the first reason a GPU stays unknown */
} conv;

static void note_once(conv *c, const char *what) {
    if (!c->note[0]) snprintf(c->note, sizeof(c->note), "%s", what);
}

static void warn_model(conv *c, const mt_topo_gpu *g) {
    for (size_t i = 0; i < c->n_warned; i++)
        if (strcmp(c->warned_models[i], g->name) == 0) return;
    c->warned_models[c->n_warned++] = g->name;
    mt_log(MT_LOG_WARN,
           "topology %s: NVLink per-link rate of GPU model '%s' is not known; its NVLinkBandwidth "
           "values cannot be turned into link counts, so its NVLink stays unknown",
           c->t->source, g->name);
    char why[200];
    snprintf(why, sizeof(why), "NVLink unknown for GPU model '%s': no per-link rate known for it",
             g->name);
    note_once(c, why);
}

/* The value between row i and column j; a file may fill only one side. */
static uint64_t entry(const mt_topo *t, size_t i, size_t j) {
    uint64_t a = t->nvlink_bw[i * t->nvlink_bw_n + j], b = t->nvlink_bw[j * t->nvlink_bw_n + i];
    return a > b ? a : b;
}

/* Adds the links of gpus[g] from its row; leaves it unknown where the row cannot be read. */
static mt_status convert_gpu(conv *c, size_t g) {
    mt_topo *t = c->t;
    mt_topo_gpu *gpu = &t->gpus[g];
    int row = find_label(t, gpu->bus_id);
    if (row < 0) {
        char why[160];
        snprintf(why, sizeof(why), "NVLink unknown for GPU %s: it is not in the NVLinkBandwidth "
                 "matrix", gpu->bus_id);
        note_once(c, why);
        return MT_OK;
    }
    size_t n = t->nvlink_bw_n, nonzero = 0;
    for (size_t j = 0; j < n; j++) nonzero += j != (size_t)row && entry(t, (size_t)row, j) != 0;
    if (nonzero == 0) {
        gpu->nvlink_known = 1; /* listed, with no active link */
        return MT_OK;
    }
    uint64_t rate = mt_topo_nvlink_rate(gpu->name, NULL);
    if (rate == 0) {
        warn_model(c, gpu);
        return MT_OK;
    }
    for (size_t j = 0; j < n; j++) {
        uint64_t v = entry(t, (size_t)row, j);
        if (j == (size_t)row || v == 0) continue;
        const char *label = t->nvlink_bw_labels[j] ? t->nvlink_bw_labels[j] : "";
        if (v > rate * MT_TOPO_NVLINK_ENTRY_MAX) {
            mt_log(MT_LOG_WARN, "topology %s: NVLinkBandwidth between GPU %s and %s is %llu MB/s, "
                   "more than %d links; the GPU's NVLink is left unknown", t->source,
                   gpu->bus_id, label, (unsigned long long)v, MT_TOPO_NVLINK_ENTRY_MAX);
            char why[200];
            snprintf(why, sizeof(why), "NVLink unknown for GPU %s: its NVLinkBandwidth entry "
                     "for %s is absurd", gpu->bus_id, label);
            note_once(c, why);
            mt_topo_gpu_clear_links(&t->gpus[g]);
            return MT_OK;
        }
        uint64_t count = (v + rate / 2) / rate;
        if (count == 0) count = 1; /* a non-zero value is at least one link */
        if (count * rate != v && c->inexact++ == 0)
            snprintf(c->inexact_first, sizeof(c->inexact_first),
                     "GPU %s to %s is %llu MB/s, read as %llu links of %llu", gpu->bus_id, label,
                     (unsigned long long)v, (unsigned long long)count, (unsigned long long)rate);
        /* A label that would not fit a bus id field is cut; only GPU and switch labels are ever
         * compared, and those are bus ids. */
        char target[MT_TOPO_BUSID_MAX];
        snprintf(target, sizeof(target), "%s", label);
        /* gpus[] does not move while links are added, so gpu stays valid */
        MT_TRY(mt_topo_gpu_add_link(t, &t->gpus[g], target, label_kind(t, label), (int)count));
    }
    return MT_OK;
}

mt_status mt_topo_links_from_nvlink_bw(mt_topo *t) {
    if (t->nvlink_bw_n == 0 || t->n_gpus == 0) return MT_OK;
    conv c = {.t = t};
    c.warned_models = calloc(t->n_gpus, sizeof(*c.warned_models));
    if (!c.warned_models)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "topology %s: out of memory reading NVLinks",
                        t->source);
    mt_status s = MT_OK;
    for (size_t g = 0; g < t->n_gpus && s == MT_OK; g++) s = convert_gpu(&c, g);
    free(c.warned_models);
    MT_TRY(s);
    if (c.inexact)
        mt_log(MT_LOG_WARN, "topology %s: %zu NVLinkBandwidth value(s) are not a whole number of "
               "links and were rounded to the nearest (first: %s)", t->source, c.inexact,
               c.inexact_first);
    if (c.note[0]) MT_TRY(mt_topo_set_nvlink_note(t, "%s", c.note));
    return MT_OK;
}
