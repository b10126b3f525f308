/* Classification of a loaded topology with nvidia-smi's definitions (see topo/classify.h).
 *
 * PCIe: the path between two devices runs up the PCI tree to their lowest common ancestor. A host
 * bridge there gives PHB; otherwise the bridges on the path are counted (the common one and those
 * below it on either side), as NCCL does: one gives PIX, more give PXB. Without a common ancestor
 * the devices hang off different host bridges (hwloc) or different top-level <pci> of a <cpu>
 * (NCCL XML, which cannot tell PHB from NODE): NODE within one NUMA node, SYS across.
 *
 * NVLink: direct GPU-GPU links count for the pair; all NVSwitches are taken as one fabric (as
 * NCCL does), so two GPUs that both reach switches get NV(min of their switch link totals).
 * That holds for hwloc's NVLinkBandwidth matrix too, although it never links one switch to
 * another: NVML, which hwloc builds the matrix from, reports the links of GPUs only, so a trunk
 * between switches cannot appear and its absence says nothing. The DGX-2 file shows it: GPUs 0-7
 * reach six switches of one baseboard, GPUs 8-15 six others, no switch-switch entry, yet the two
 * baseboards are joined by NVSwitch trunks; nvidia-smi reports NV6 for every pair and so do we,
 * and its 16 GPUs are one island. Links to a CPU (POWER8/9, kind OTHER) reach no GPU and count
 * neither for a pair nor for a GPU's NVLink total.
 * Self links (the Azure NC A100 v4 file lists 12 per GPU, naming the GPU itself) reach no peer:
 * NCCL connects such an edge to the GPU itself, where its path search never uses it, so the file
 * gives no NVLink between peers and neither do we; those pairs get their PCIe/NUMA code. */
#include "topo/classify.h"

#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *mt_topo_conn_str(mt_topo_conn c, char *buf, size_t size) {
    static const char *const names[] = {"X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS"};
    if (c.code == MT_TOPO_NV)
        snprintf(buf, size, "NV%d", c.nvlinks);
    else
        snprintf(buf, size, "%s", (unsigned)c.code <= MT_TOPO_SYS ? names[c.code] : "?");
    return buf;
}

static int switch_links(const mt_topo_gpu *g) {
    int n = 0;
    for (size_t i = 0; i < g->n_links; i++)
        if (g->links[i].kind == MT_TOPO_LINK_SWITCH) n += g->links[i].count;
    return n;
}

static int direct_links(const mt_topo_gpu *g, const char *peer_busid) {
    int n = 0;
    for (size_t i = 0; i < g->n_links; i++)
        if (g->links[i].kind == MT_TOPO_LINK_GPU && strcmp(g->links[i].target, peer_busid) == 0)
            n += g->links[i].count;
    return n;
}

int mt_topo_gpu_nvlinks(const mt_topo *t, size_t gpu) {
    const mt_topo_gpu *g = &t->gpus[gpu];
    int n = 0;
    for (size_t i = 0; i < g->n_links; i++)
        if (g->links[i].kind == MT_TOPO_LINK_SWITCH || g->links[i].kind == MT_TOPO_LINK_GPU)
            n += g->links[i].count;
    return n;
}

/* NVLinks between two distinct GPUs: the larger of the two directions (a file may list a direct
 * link on one side only), plus what the switch fabric gives. */
static int pair_nvlinks(const mt_topo *t, size_t a, size_t b) {
    const mt_topo_gpu *ga = &t->gpus[a], *gb = &t->gpus[b];
    int ab = direct_links(ga, gb->bus_id), ba = direct_links(gb, ga->bus_id);
    int n = ab > ba ? ab : ba;
    int sa = switch_links(ga), sb = switch_links(gb);
    if (sa > 0 && sb > 0) n += sa < sb ? sa : sb;
    return n;
}

static int pci_parent(const mt_topo *t, int i) {
    return (i >= 0 && (size_t)i < t->n_pci) ? t->pci[i].parent : -1;
}

static int is_bridge(const mt_topo *t, int i) {
    return t->pci[i].kind == MT_TOPO_PCI_BRIDGE;
}

/* The device and its ancestors, nearest first; bounded so that a malformed chain cannot loop. In
 * a tree under a host bridge (hwloc) a PCIe switch shows as an upstream-port bridge holding
 * downstream-port bridges; nvidia-smi counts the switch once, and NCCL's own XML keeps one node
 * per switch (it skips the downstream port), so a downstream port directly under another bridge
 * is dropped from the chain and the pair counts as one bridge. */
static size_t pci_chain(const mt_topo *t, int i, int *chain, size_t max) {
    size_t n = 0;
    int host = 0;
    for (int k = i; k >= 0 && (size_t)k < t->n_pci && n < max; k = pci_parent(t, k), n++)
        host = t->pci[k].kind == MT_TOPO_PCI_HOST_BRIDGE;
    n = 0;
    while (i >= 0 && (size_t)i < t->n_pci && n < max) {
        chain[n++] = i;
        int p = pci_parent(t, i);
        if (host && p >= 0 && is_bridge(t, p)) {
            int pp = pci_parent(t, p);
            if (pp >= 0 && is_bridge(t, pp)) p = pp; /* p is a downstream port of switch pp */
        }
        i = p;
    }
    return n;
}

#define CHAIN_MAX 300 /* above both loaders' nesting limits (hwloc 256, NCCL 32) */

static mt_topo_conn pcie_conn(const mt_topo *t, int pa, int numa_a, int pb, int numa_b) {
    mt_topo_conn c = {MT_TOPO_SYS, 0};
    int ca[CHAIN_MAX], cb[CHAIN_MAX];
    size_t na = pci_chain(t, pa, ca, CHAIN_MAX), nb = pci_chain(t, pb, cb, CHAIN_MAX);
    for (size_t i = 0; i < na; i++) {
        size_t j = 0;
        while (j < nb && cb[j] != ca[i]) j++;
        if (j == nb) continue;
        /* ca[i] is the lowest common ancestor */
        if (t->pci[ca[i]].kind == MT_TOPO_PCI_HOST_BRIDGE) {
            c.code = MT_TOPO_PHB;
            return c;
        }
        int bridges = 0;
        for (size_t k = 0; k <= i; k++) bridges += is_bridge(t, ca[k]);
        for (size_t k = 0; k < j; k++) bridges += is_bridge(t, cb[k]);
        c.code = bridges <= 1 ? MT_TOPO_PIX : MT_TOPO_PXB;
        return c;
    }
    int same_numa = numa_a >= 0 ? numa_a == numa_b : (numa_b < 0 && t->n_numa <= 1);
    c.code = same_numa ? MT_TOPO_NODE : MT_TOPO_SYS;
    return c;
}

mt_topo_conn mt_topo_gpu_gpu(const mt_topo *t, size_t a, size_t b) {
    mt_topo_conn c = {MT_TOPO_X, 0};
    if (a == b) return c;
    int nv = pair_nvlinks(t, a, b);
    if (nv > 0) {
        c.code = MT_TOPO_NV;
        c.nvlinks = nv;
        return c;
    }
    return pcie_conn(t, t->gpus[a].pci, t->gpus[a].numa, t->gpus[b].pci, t->gpus[b].numa);
}

mt_topo_conn mt_topo_gpu_nic(const mt_topo *t, size_t gpu, size_t nic) {
    return pcie_conn(t, t->gpus[gpu].pci, t->gpus[gpu].numa, t->nics[nic].pci, t->nics[nic].numa);
}

mt_topo_conn mt_topo_nic_nic(const mt_topo *t, size_t a, size_t b) {
    if (a == b) return (mt_topo_conn){MT_TOPO_X, 0};
    return pcie_conn(t, t->nics[a].pci, t->nics[a].numa, t->nics[b].pci, t->nics[b].numa);
}

int mt_topo_nearest_nic(const mt_topo *t, size_t gpu) {
    int best = -1;
    mt_topo_code best_code = MT_TOPO_SYS;
    for (size_t i = 0; i < t->n_nics; i++) {
        mt_topo_code code = mt_topo_gpu_nic(t, gpu, i).code;
        if (best < 0 || code < best_code) best = (int)i, best_code = code;
    }
    return best;
}

static int uf_find(int *parent, int i) {
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
}

mt_status mt_topo_nvlink_islands(const mt_topo *t, int *island_of, size_t *n_islands) {
    size_t n = t->n_gpus;
    *n_islands = 0;
    int *parent = malloc((n ? n : 1) * sizeof(*parent));
    if (!parent) return mt_error(MT_ERR_OUT_OF_MEMORY, "topology: out of memory for NVLink islands");
    for (size_t i = 0; i < n; i++) parent[i] = (int)i;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (pair_nvlinks(t, i, j) > 0) {
                int ri = uf_find(parent, (int)i), rj = uf_find(parent, (int)j);
                /* the smaller root wins, so each root is its island's first GPU */
                if (ri < rj) parent[rj] = ri;
                else if (rj < ri) parent[ri] = rj;
            }
    for (size_t i = 0; i < n; i++) {
        int r = uf_find(parent, (int)i);
        island_of[i] = (size_t)r == i ? (int)(*n_islands)++ : island_of[r];
    }
    free(parent);
    return MT_OK;
}

/* How strongly two GPUs are connected, larger is better: the code's rank, NVLink counts breaking
 * ties between NV pairs; the same island outranks any PCIe code even without a direct link. */
static long pair_score(const mt_topo *t, const int *island_of, size_t a, size_t b) {
    mt_topo_conn c = mt_topo_gpu_gpu(t, a, b);
    long score = (long)(MT_TOPO_SYS - c.code) * 1000 + c.nvlinks;
    if (island_of[a] == island_of[b]) score += 100000; /* NVLink, maybe through other GPUs */
    return score;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

mt_status mt_topo_tp_groups(const mt_topo *t, int tp, int *groups_out, size_t *n_groups) {
    size_t n = t->n_gpus;
    *n_groups = 0;
    if (tp <= 0 || (size_t)tp > n || n % (size_t)tp != 0) return MT_OK;
    int *island_of = malloc(n * sizeof(*island_of));
    char *used = calloc(n, 1);
    size_t *member = malloc((size_t)tp * sizeof(*member));
    mt_status s = MT_OK;
    if (!island_of || !used || !member)
        s = mt_error(MT_ERR_OUT_OF_MEMORY, "topology: out of memory for TP groups");
    size_t n_islands;
    if (s == MT_OK) s = mt_topo_nvlink_islands(t, island_of, &n_islands);
    /* Greedy: the lowest free GPU seeds a group, which then takes the free GPU whose weakest
     * connection to the group is strongest (then the best total, then the lowest position). The
     * seed order makes a fully switched host give consecutive groups and NVLink pairs stay pairs. */
    for (size_t g = 0; s == MT_OK && g < n / (size_t)tp; g++) {
        size_t seed = 0;
        while (used[seed]) seed++;
        used[seed] = 1;
        member[0] = seed;
        for (int k = 1; k < tp; k++) {
            size_t best = n;
            long best_min = 0, best_sum = 0;
            for (size_t c = 0; c < n; c++) {
                if (used[c]) continue;
                long mn = 0, sum = 0;
                for (int m = 0; m < k; m++) {
                    long sc = pair_score(t, island_of, member[m], c);
                    if (m == 0 || sc < mn) mn = sc;
                    sum += sc;
                }
                if (best == n || mn > best_min || (mn == best_min && sum > best_sum))
                    best = c, best_min = mn, best_sum = sum;
            }
            used[best] = 1;
            member[k] = best;
        }
        int *out = groups_out + g * (size_t)tp;
        for (int k = 0; k < tp; k++) out[k] = t->gpus[member[k]].index;
        qsort(out, (size_t)tp, sizeof(*out), cmp_int);
    }
    if (s == MT_OK) {
        /* order groups by their first GPU; seeds ascend by position, and indices ascend with
         * position, so this holds already, but sort anyway in case indices are sparse */
        size_t ng = n / (size_t)tp;
        for (size_t i = 1; i < ng; i++)
            for (size_t j = i; j > 0 && groups_out[(j - 1) * tp] > groups_out[j * tp]; j--)
                for (int k = 0; k < tp; k++) {
                    int tmp = groups_out[(j - 1) * tp + k];
                    groups_out[(j - 1) * tp + k] = groups_out[j * tp + k];
                    groups_out[j * tp + k] = tmp;
                }
        *n_groups = ng;
    }
    free(island_of);
    free(used);
    free(member);
    return s;
}
