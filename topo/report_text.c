/* The text report of `mt-topo`: the machine, a matrix laid out like `nvidia-smi topo -m` (GPU and
 * NIC rows and columns, CPU and NUMA affinity), legends, and a summary for placing ranks. */
#include "topo/report.h"

#include "core/error.h"

#include <stdlib.h>
#include <string.h>

const char *mt_topo_nvlink_unknown_reason(const mt_topo *t) {
    static const char prefix[] = "NVLink unknown: ";
    for (size_t i = 0; i < t->n_gpus; i++)
        if (!t->gpus[i].nvlink_known) {
            if (t->nvlink_note && *t->nvlink_note)
                return strncmp(t->nvlink_note, prefix, sizeof(prefix) - 1) == 0
                           ? t->nvlink_note + sizeof(prefix) - 1
                           : t->nvlink_note;
            return strcmp(t->source, "live") == 0
                       ? "live discovery did not read NVLink state from NVML"
                       : "the topology source gives no NVLink data for its GPUs";
        }
    return NULL;
}

static void machine_section(const mt_topo *t, FILE *out) {
    fprintf(out, "Source: %s\n", t->source);
    if (t->n_packages == 0) {
        fprintf(out, "Packages: unknown (the source does not list them)\n");
    } else {
        fprintf(out, "Packages: %zu\n", t->n_packages);
        for (size_t i = 0; i < t->n_packages; i++)
            fprintf(out, "  Package %d: CPUs %s\n", t->packages[i].id,
                    *t->packages[i].cpus ? t->packages[i].cpus : "unknown");
    }
    fprintf(out, "NUMA nodes: %zu\n", t->n_numa);
    for (size_t i = 0; i < t->n_numa; i++)
        fprintf(out, "  NUMA %d: CPUs %s\n", t->numa[i].id,
                *t->numa[i].cpus ? t->numa[i].cpus : "none");
    if (t->n_cores > 0 && t->n_pus > 0)
        fprintf(out, "Cores: %zu, PUs: %zu\n", t->n_cores, t->n_pus);
    else if (t->n_cores > 0)
        fprintf(out, "Cores: %zu\n", t->n_cores);
    else if (t->n_pus > 0)
        fprintf(out, "PUs: %zu\n", t->n_pus);
    fprintf(out, "GPUs: %zu\n", t->n_gpus);
    fprintf(out, "NICs: %zu\n", t->n_nics);
    if (t->n_gpus == 0) {
        fprintf(out, "No NVIDIA GPU found.\n");
        return;
    }
    const char *why = mt_topo_nvlink_unknown_reason(t);
    if (!why) return;
    size_t unknown = 0;
    for (size_t i = 0; i < t->n_gpus; i++) unknown += !t->gpus[i].nvlink_known;
    if (unknown == t->n_gpus) {
        fprintf(out, "NVLink: unknown (%s)\n", why);
        return;
    }
    fprintf(out, "NVLink: unknown for");
    for (size_t i = 0; i < t->n_gpus; i++)
        if (!t->gpus[i].nvlink_known) fprintf(out, " GPU%d", t->gpus[i].index);
    fprintf(out, " (%s)\n", why);
}

/* Column labels: GPU<index> then NIC<position>. */
static void label(const mt_topo *t, size_t i, char *buf, size_t size) {
    if (i < t->n_gpus)
        snprintf(buf, size, "GPU%d", t->gpus[i].index);
    else
        snprintf(buf, size, "NIC%zu", i - t->n_gpus);
}

mt_topo_conn mt_topo_matrix_conn(const mt_topo *t, size_t a, size_t b) {
    size_t g = t->n_gpus;
    if (a < g && b < g) return mt_topo_gpu_gpu(t, a, b);
    if (a < g) return mt_topo_gpu_nic(t, a, b - g);
    if (b < g) return mt_topo_gpu_nic(t, b, a - g);
    return mt_topo_nic_nic(t, a - g, b - g);
}

/* One cell: padded to width unless it ends the line, so that lines carry no trailing blanks. */
static void cell(FILE *out, const char *text, int width, int last) {
    if (last)
        fprintf(out, "%s\n", text);
    else
        fprintf(out, "%-*s", width, text);
}

static void matrix(const mt_topo *t, FILE *out) {
    size_t n = t->n_gpus + t->n_nics;
    char buf[32];
    int width = 6; /* the widest label or code, plus two spaces */
    int aff = (int)strlen("CPU Affinity") + 2;
    for (size_t i = 0; i < n; i++) {
        label(t, i, buf, sizeof(buf));
        if ((int)strlen(buf) + 2 > width) width = (int)strlen(buf) + 2;
        for (size_t k = 0; k < n; k++) {
            mt_topo_conn_str(mt_topo_matrix_conn(t, i, k), buf, sizeof(buf));
            if ((int)strlen(buf) + 2 > width) width = (int)strlen(buf) + 2;
        }
        if (i < t->n_gpus && (int)strlen(t->gpus[i].cpus) + 2 > aff)
            aff = (int)strlen(t->gpus[i].cpus) + 2;
    }
    fprintf(out, "\n%*s", width, "");
    for (size_t i = 0; i < n; i++) {
        label(t, i, buf, sizeof(buf));
        cell(out, buf, width, 0);
    }
    cell(out, "CPU Affinity", aff, 0);
    cell(out, "NUMA Affinity", 0, 1);
    for (size_t i = 0; i < n; i++) {
        int gpu_row = i < t->n_gpus;
        label(t, i, buf, sizeof(buf));
        cell(out, buf, width, 0);
        for (size_t k = 0; k < n; k++) {
            mt_topo_conn_str(mt_topo_matrix_conn(t, i, k), buf, sizeof(buf));
            cell(out, buf, width, !gpu_row && k + 1 == n);
        }
        if (!gpu_row) continue; /* nvidia-smi gives NICs no affinity columns either */
        const mt_topo_gpu *g = &t->gpus[i];
        char numa[16] = "N/A";
        if (g->numa >= 0) snprintf(numa, sizeof(numa), "%d", g->numa);
        cell(out, *g->cpus ? g->cpus : "N/A", aff, 0);
        cell(out, numa, 0, 1);
    }
    fprintf(out, "\nLegend:\n"
                 "  X    = the device itself\n"
                 "  NV#  = # NVLinks bonded between the pair (through NVSwitches: the GPU's links "
                 "into the switch fabric)\n"
                 "  PIX  = a path through at most one PCIe bridge\n"
                 "  PXB  = a path through several PCIe bridges, no PCIe host bridge\n"
                 "  PHB  = a path through a PCIe host bridge (the CPU's root complex)\n"
                 "  NODE = a path between PCIe host bridges inside one NUMA node\n"
                 "  SYS  = a path across the interconnect between NUMA nodes (QPI/UPI, xGMI, "
                 "X-Bus)\n");
    if (t->n_nics == 0) return;
    fprintf(out, "\nNIC Legend:\n");
    for (size_t i = 0; i < t->n_nics; i++) {
        const mt_topo_nic *c = &t->nics[i];
        if (*c->name)
            fprintf(out, "  NIC%zu: %s%s%s%s\n", i, c->name, *c->bus_id ? " (" : "", c->bus_id,
                    *c->bus_id ? ")" : "");
        else
            fprintf(out, "  NIC%zu: unnamed (%s)\n", i, *c->bus_id ? c->bus_id : "no PCI address");
    }
}

static mt_status summary(const mt_topo *t, FILE *out) {
    size_t n = t->n_gpus, n_islands = 0;
    int *island = malloc(n * sizeof(*island));
    int *groups = malloc(n * sizeof(*groups));
    mt_status s = (island && groups)
                      ? MT_OK
                      : mt_error(MT_ERR_OUT_OF_MEMORY, "topology report: out of memory");
    if (s == MT_OK) s = mt_topo_nvlink_islands(t, island, &n_islands);
    if (s == MT_OK) {
        int unknown = mt_topo_nvlink_unknown_reason(t) != NULL;
        fprintf(out, "\nNVLink islands: %zu%s\n", n_islands,
                unknown ? " (GPUs whose NVLink is unknown count alone)" : "");
        for (size_t k = 0; k < n_islands; k++) {
            fprintf(out, "  island %zu:", k);
            for (size_t i = 0; i < n; i++)
                if (island[i] == (int)k) fprintf(out, " GPU%d", t->gpus[i].index);
            fputc('\n', out);
        }
        fprintf(out, "GPUs per NUMA node:\n");
        for (size_t k = 0; k <= t->n_numa; k++) {
            int id = k < t->n_numa ? t->numa[k].id : -1;
            size_t count = 0;
            for (size_t i = 0; i < n; i++) count += t->gpus[i].numa == id;
            if (count == 0) {
                if (k < t->n_numa) fprintf(out, "  NUMA %d: none\n", id);
                continue;
            }
            if (k < t->n_numa) fprintf(out, "  NUMA %d:", id);
            else fprintf(out, "  NUMA unknown:");
            for (size_t i = 0; i < n; i++)
                if (t->gpus[i].numa == id) fprintf(out, " GPU%d", t->gpus[i].index);
            fputc('\n', out);
        }
        fprintf(out, "Nearest NIC:\n");
        for (size_t i = 0; i < n; i++) {
            int nic = mt_topo_nearest_nic(t, i);
            if (nic < 0) {
                fprintf(out, "  GPU%d: none (no NIC)\n", t->gpus[i].index);
                continue;
            }
            char code[16];
            mt_topo_conn_str(mt_topo_gpu_nic(t, i, (size_t)nic), code, sizeof(code));
            const char *name = *t->nics[nic].name ? t->nics[nic].name : t->nics[nic].bus_id;
            fprintf(out, "  GPU%d: NIC%d (%s, %s)\n", t->gpus[i].index, nic, name, code);
        }
        fprintf(out, "Recommended TP groups:\n");
    }
    static const int tps[] = {2, 4, 8};
    for (size_t k = 0; s == MT_OK && k < sizeof(tps) / sizeof(tps[0]); k++) {
        int tp = tps[k];
        size_t n_groups = 0;
        s = mt_topo_tp_groups(t, tp, groups, &n_groups);
        if (s != MT_OK) break;
        fprintf(out, "  tp=%d:", tp);
        if ((size_t)tp > n)
            fprintf(out, " none: only %zu GPU%s\n", n, n == 1 ? "" : "s");
        else if (n_groups == 0)
            fprintf(out, " none: %zu GPUs do not split into groups of %d\n", n, tp);
        else {
            for (size_t g = 0; g < n_groups; g++) {
                fputs(" [", out);
                for (int m = 0; m < tp; m++)
                    fprintf(out, "%s%d", m ? "," : "", groups[g * (size_t)tp + (size_t)m]);
                fputc(']', out);
            }
            fputc('\n', out);
        }
    }
    free(island);
    free(groups);
    return s;
}

mt_status mt_topo_report_text(const mt_topo *t, FILE *out) {
    machine_section(t, out);
    if (t->n_gpus + t->n_nics > 0) matrix(t, out);
    if (t->n_gpus > 0) MT_TRY(summary(t, out));
    if (fflush(out) != 0 || ferror(out))
        return mt_error(MT_ERR_IO, "topology report: writing the report failed");
    return MT_OK;
}
