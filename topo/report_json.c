/* The JSON report of `mt-topo --json`: the facts of the text report as one object. The fields
 * that are its core (source, gpus, nics, matrix, nvlink_islands, tp_groups) keep their names and
 * shapes; the others (packages, numa_nodes with their CPU identity, cores, pus, nvlink_note,
 * nearest_nic, the PCIe link of GPUs and NICs) are additions. */
#include "topo/report.h"

#include "core/error.h"
#include "core/json_writer.h"

#include <math.h>
#include <stdlib.h>

static void int_or_null(mt_json *j, int64_t v, int known) {
    if (known) mt_json_int(j, v);
    else mt_json_null(j);
}

/* A NUMA node's CPU as NCCL's <cpu> names it; null for what the source does not say. */
static void cpu_id(mt_json *j, const mt_topo_cpu_id *id) {
    mt_json_key(j, "arch");
    mt_json_string(j, *id->arch ? id->arch : NULL);
    mt_json_key(j, "vendor");
    mt_json_string(j, *id->vendor ? id->vendor : NULL);
    mt_json_key(j, "familyid");
    int_or_null(j, id->family, id->family >= 0);
    mt_json_key(j, "modelid");
    int_or_null(j, id->model, id->model >= 0);
}

static void cpusets(mt_json *j, const char *key, const mt_topo_cpuset *sets, size_t n,
                    int with_id) {
    mt_json_key(j, key);
    mt_json_begin_array(j);
    for (size_t i = 0; i < n; i++) {
        mt_json_begin_object(j);
        mt_json_key(j, "id");
        mt_json_int(j, sets[i].id);
        mt_json_key(j, "cpus");
        mt_json_string(j, sets[i].cpus);
        if (with_id) cpu_id(j, &sets[i].cpu);
        mt_json_end_object(j);
    }
    mt_json_end_array(j);
}

/* The PCIe link of a device (pci[] index, -1 none): NCCL's rate name and lane count where the
 * source names them, the link's data rate in MB/s where it gives that (hwloc). */
static void pcie_link(mt_json *j, const mt_topo *t, int pci) {
    const mt_topo_pci *p = pci >= 0 && (size_t)pci < t->n_pci ? &t->pci[pci] : NULL;
    mt_json_key(j, "pcie_link_speed");
    mt_json_string(j, p && *p->link_speed ? p->link_speed : NULL);
    mt_json_key(j, "pcie_link_width");
    int_or_null(j, p ? p->link_width : 0, p && p->link_width >= 0);
    mt_json_key(j, "pcie_link_mbytes_s");
    int_or_null(j, p ? (int64_t)llround(p->link_gbps * 1000.0) : 0, p && p->link_gbps > 0);
}

static void gpus(mt_json *j, const mt_topo *t) {
    mt_json_key(j, "gpus");
    mt_json_begin_array(j);
    for (size_t i = 0; i < t->n_gpus; i++) {
        const mt_topo_gpu *g = &t->gpus[i];
        mt_json_begin_object(j);
        mt_json_key(j, "index");
        mt_json_int(j, g->index);
        mt_json_key(j, "pci_bus_id");
        mt_json_string(j, g->bus_id);
        mt_json_key(j, "name");
        mt_json_string(j, g->name);
        mt_json_key(j, "numa_node");
        int_or_null(j, g->numa, g->numa >= 0);
        mt_json_key(j, "cpu_affinity");
        mt_json_string(j, g->cpus);
        mt_json_key(j, "nvlinks");
        int_or_null(j, mt_topo_gpu_nvlinks(t, i), g->nvlink_known);
        int nic = mt_topo_nearest_nic(t, i);
        mt_json_key(j, "nearest_nic");
        int_or_null(j, nic, nic >= 0);
        pcie_link(j, t, g->pci);
        mt_json_end_object(j);
    }
    mt_json_end_array(j);
}

static void nics(mt_json *j, const mt_topo *t) {
    mt_json_key(j, "nics");
    mt_json_begin_array(j);
    for (size_t i = 0; i < t->n_nics; i++) {
        const mt_topo_nic *c = &t->nics[i];
        mt_json_begin_object(j);
        mt_json_key(j, "index");
        mt_json_int(j, (int64_t)i);
        mt_json_key(j, "name");
        mt_json_string(j, c->name);
        mt_json_key(j, "pci_bus_id");
        mt_json_string(j, *c->bus_id ? c->bus_id : NULL);
        mt_json_key(j, "numa_node");
        int_or_null(j, c->numa, c->numa >= 0);
        pcie_link(j, t, c->pci);
        mt_json_end_object(j);
    }
    mt_json_end_array(j);
}

static void matrix(mt_json *j, const mt_topo *t) {
    size_t n = t->n_gpus + t->n_nics;
    char buf[32];
    mt_json_key(j, "matrix");
    mt_json_begin_object(j);
    mt_json_key(j, "labels");
    mt_json_begin_array_inline(j);
    for (size_t i = 0; i < n; i++) {
        if (i < t->n_gpus) snprintf(buf, sizeof(buf), "GPU%d", t->gpus[i].index);
        else snprintf(buf, sizeof(buf), "NIC%zu", i - t->n_gpus);
        mt_json_string(j, buf);
    }
    mt_json_end_array(j);
    mt_json_key(j, "rows");
    mt_json_begin_array(j);
    for (size_t i = 0; i < n; i++) {
        mt_json_begin_array_inline(j);
        for (size_t k = 0; k < n; k++)
            mt_json_string(j, mt_topo_conn_str(mt_topo_matrix_conn(t, i, k), buf, sizeof(buf)));
        mt_json_end_array(j);
    }
    mt_json_end_array(j);
    mt_json_end_object(j);
}

static mt_status islands_and_groups(mt_json *j, const mt_topo *t) {
    size_t n = t->n_gpus, n_islands = 0;
    int *island = malloc((n ? n : 1) * sizeof(*island));
    int *groups = malloc((n ? n : 1) * sizeof(*groups));
    mt_status s = (island && groups)
                      ? MT_OK
                      : mt_error(MT_ERR_OUT_OF_MEMORY, "topology report: out of memory");
    if (s == MT_OK) s = mt_topo_nvlink_islands(t, island, &n_islands);
    if (s == MT_OK) {
        mt_json_key(j, "nvlink_islands");
        mt_json_begin_array(j);
        for (size_t k = 0; k < n_islands; k++) {
            mt_json_begin_array_inline(j);
            for (size_t i = 0; i < n; i++)
                if (island[i] == (int)k) mt_json_int(j, t->gpus[i].index);
            mt_json_end_array(j);
        }
        mt_json_end_array(j);
        mt_json_key(j, "tp_groups");
        mt_json_begin_object(j);
    }
    static const char *const keys[] = {"2", "4", "8"};
    for (int k = 0; s == MT_OK && k < 3; k++) {
        int tp = 2 << k;
        size_t n_groups = 0;
        s = mt_topo_tp_groups(t, tp, groups, &n_groups);
        if (s != MT_OK) break;
        mt_json_key(j, keys[k]);
        mt_json_begin_array(j);
        for (size_t g = 0; g < n_groups; g++) {
            mt_json_begin_array_inline(j);
            for (int m = 0; m < tp; m++) mt_json_int(j, groups[g * (size_t)tp + (size_t)m]);
            mt_json_end_array(j);
        }
        mt_json_end_array(j);
    }
    if (s == MT_OK) mt_json_end_object(j);
    free(island);
    free(groups);
    return s;
}

mt_status mt_topo_report_json(const mt_topo *t, FILE *out) {
    mt_json j;
    mt_json_init(&j, out);
    mt_json_begin_object(&j);
    mt_json_key(&j, "source");
    mt_json_string(&j, t->source);
    cpusets(&j, "packages", t->packages, t->n_packages, 0);
    cpusets(&j, "numa_nodes", t->numa, t->n_numa, 1);
    mt_json_key(&j, "cores");
    int_or_null(&j, (int64_t)t->n_cores, t->n_cores > 0);
    mt_json_key(&j, "pus");
    int_or_null(&j, (int64_t)t->n_pus, t->n_pus > 0);
    mt_json_key(&j, "nvlink_note");
    mt_json_string(&j, mt_topo_nvlink_unknown_reason(t));
    gpus(&j, t);
    nics(&j, t);
    matrix(&j, t);
    MT_TRY(islands_and_groups(&j, t));
    mt_json_end_object(&j);
    return mt_json_end(&j);
}
