/* Classification of real topology files (tests/fixtures/topologies/) and of small built models.
 * Each expected code was read off the XML: the <pci> nesting and <cpu numaid> of NCCL files,
 * the Bridge/PCIDev nesting and NUMA nodes of hwloc files, the <nvlink> counts of each <gpu>. */
#include "check.h"
#include "topo_fixture.h"
#include "topo/classify.h"

#include <meshtrain/status.h>

#include <stdio.h>
#include <string.h>


static int gpu_at(const mt_topo *t, const char *busid) {
    for (size_t i = 0; i < t->n_gpus; i++)
        if (strcmp(t->gpus[i].bus_id, busid) == 0) return (int)i;
    return -1;
}

static int nic_at(const mt_topo *t, const char *busid_or_name) {
    for (size_t i = 0; i < t->n_nics; i++)
        if (strcmp(t->nics[i].bus_id, busid_or_name) == 0 ||
            strcmp(t->nics[i].name, busid_or_name) == 0)
            return (int)i;
    return -1;
}

/* Checks the code between two GPUs named by bus id, or a GPU and a NIC (is_nic). */
static void expect_code(const mt_topo *t, const char *a, const char *b, int is_nic,
                        const char *want) {
    int i = gpu_at(t, a), j = is_nic ? nic_at(t, b) : gpu_at(t, b);
    CHECK_MSG(i >= 0 && j >= 0, "%s: %s or %s not found", t->source, a, b);
    if (i < 0 || j < 0) return;
    char got[16];
    mt_topo_conn c = is_nic ? mt_topo_gpu_nic(t, (size_t)i, (size_t)j)
                            : mt_topo_gpu_gpu(t, (size_t)i, (size_t)j);
    mt_topo_conn_str(c, got, sizeof(got));
    CHECK_MSG(strcmp(got, want) == 0, "%s: %s-%s is %s, expected %s", t->source, a, b, got, want);
    if (!is_nic) { /* symmetric */
        mt_topo_conn_str(mt_topo_gpu_gpu(t, (size_t)j, (size_t)i), got, sizeof(got));
        CHECK_MSG(strcmp(got, want) == 0, "%s: %s-%s is %s, expected %s", t->source, b, a, got,
                  want);
    }
}

/* Compares the TP groups for tp with want (GPU indices, group after group; n_want groups). */
static void expect_tp(const mt_topo *t, int tp, const int *want, size_t n_want) {
    int got[64];
    size_t n = 99;
    CHECK_OK(mt_topo_tp_groups(t, tp, got, &n));
    CHECK_MSG(n == n_want, "%s: tp=%d gives %zu groups, expected %zu", t->source, tp, n, n_want);
    if (n != n_want) return;
    for (size_t i = 0; i < n * (size_t)tp; i++)
        CHECK_MSG(got[i] == want[i], "%s: tp=%d entry %zu is GPU%d, expected GPU%d", t->source,
                  tp, i, got[i], want[i]);
}

static void expect_islands(const mt_topo *t, const int *want, size_t n_want) {
    int got[64];
    size_t n = 99;
    CHECK_OK(mt_topo_nvlink_islands(t, got, &n));
    CHECK_MSG(n == n_want, "%s: %zu islands, expected %zu", t->source, n, n_want);
    for (size_t i = 0; i < t->n_gpus; i++)
        CHECK_MSG(got[i] == want[i], "%s: gpus[%zu] in island %d, expected %d", t->source, i,
                  got[i], want[i]);
}

static const int consecutive[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* IBM Cloud gx3d: every <gpu> has nvlinks into 4 NVSwitches with counts 4+4+5+5 = 18; each GPU
 * shares a bridge (0x060400) with one ConnectX-7; <cpu numaid=0> holds GPUs 0-3. */
static void test_ibm_h100(void) {
    mt_topo *t = load_fixture("nccl-ibmcloud-gx3d-h100x8-vsi-topo.xml");
    if (!t) return;
    for (size_t i = 0; i < t->n_gpus; i++) {
        CHECK_MSG(mt_topo_gpu_nvlinks(t, i) == 18, "GPU%zu has %d NVLinks", i,
                  mt_topo_gpu_nvlinks(t, i));
        for (size_t j = 0; j < t->n_gpus; j++) {
            char got[16];
            mt_topo_conn_str(mt_topo_gpu_gpu(t, i, j), got, sizeof(got));
            CHECK_MSG(strcmp(got, i == j ? "X" : "NV18") == 0, "GPU%zu-GPU%zu is %s", i, j, got);
        }
    }
    expect_code(t, "0000:a4:00.0", "mlx5_7", 1, "PIX");  /* both under bridge a1:00.0 */
    expect_code(t, "0000:a4:00.0", "mlx5_6", 1, "NODE"); /* bridge ab:00.0, same <cpu> */
    expect_code(t, "0000:a4:00.0", "mlx5_3", 1, "SYS");  /* <cpu numaid=1> */
    int gpu0 = gpu_at(t, "0000:a4:00.0");
    if (gpu0 >= 0) CHECK(mt_topo_nearest_nic(t, (size_t)gpu0) == nic_at(t, "mlx5_7"));
    const int one[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    expect_islands(t, one, 1);
    expect_tp(t, 2, consecutive, 4);
    expect_tp(t, 4, consecutive, 2);
    expect_tp(t, 8, consecutive, 1);
    mt_topo_destroy(t);
}

/* NCCL issue 2397: two A100 PCIe, one per <cpu>; the ConnectX-6 Dx (mlx5_0, mlx5_1) is its own
 * top-level <pci> of <cpu numaid=0>; no <nvlink>. */
static void test_2xa100_pcie(void) {
    mt_topo *t = load_fixture("nccl-issue2397-2xA100pcie-cx6dx-icelake-hostA.xml");
    if (!t) return;
    expect_code(t, "0000:69:00.0", "0000:b1:00.0", 0, "SYS");
    expect_code(t, "0000:69:00.0", "mlx5_0", 1, "NODE");
    expect_code(t, "0000:b1:00.0", "mlx5_1", 1, "SYS");
    CHECK(strcmp(t->gpus[0].cpus, "0-27,56-83") == 0 && t->gpus[0].numa == 0);
    CHECK(strcmp(t->gpus[1].cpus, "28-55,84-111") == 0 && t->gpus[1].numa == 1);
    const int two[2] = {0, 1};
    expect_islands(t, two, 2);
    expect_tp(t, 2, consecutive, 1);
    expect_tp(t, 4, NULL, 0); /* more than the GPUs */
    mt_topo_destroy(t);
}

/* Azure ND A100 v4: each virtual bridge ffff:ff:0N.0 holds two GPUs and two IB NICs; GPUs
 * 0001/0002 sit under <cpu numaid=1>, 0003/0004 under numaid=0. The file has no <gpu>/<nvlink>
 * (the NVSwitch fabric is not described), so the codes are PCIe ones. */
static void test_ndv4(void) {
    mt_topo *t = load_fixture("nccl-azure-ndv4-a100x8-topo.xml");
    if (!t) return;
    expect_code(t, "0001:00:00.0", "0002:00:00.0", 0, "PIX");
    expect_code(t, "0001:00:00.0", "0003:00:00.0", 0, "SYS");
    expect_code(t, "0001:00:00.0", "0101:00:00.0", 1, "PIX");
    expect_code(t, "0001:00:00.0", "0103:00:00.0", 1, "SYS");
    expect_tp(t, 2, consecutive, 4); /* the PIX pairs, in PCI order */
    mt_topo_destroy(t);
}

/* Azure ND H100 v5: one GPU and one IB NIC per virtual bridge, four bridges per <cpu>. */
static void test_ndv5(void) {
    mt_topo *t = load_fixture("nccl-azure-ndv5-h100x8-topo.xml");
    if (!t) return;
    expect_code(t, "0001:00:00.0", "0101:00:00.0", 1, "PIX");
    expect_code(t, "0001:00:00.0", "0102:00:00.0", 1, "NODE");
    expect_code(t, "0001:00:00.0", "0002:00:00.0", 0, "NODE");
    expect_code(t, "0001:00:00.0", "0009:00:00.0", 0, "SYS");
    mt_topo_destroy(t);
}

/* Azure NC A100 v4: each <gpu> has one <nvlink> naming itself (count 12); one GPU per <cpu>;
 * eth0 hangs directly under <cpu numaid=0>. Self links reach no peer (see topo/classify.c). */
static void test_ncv4_self_links(void) {
    mt_topo *t = load_fixture("nccl-azure-ncv4-a100x4-topo.xml");
    if (!t) return;
    for (size_t i = 0; i < t->n_gpus; i++) CHECK(mt_topo_gpu_nvlinks(t, i) == 0);
    expect_code(t, "0001:00:00.0", "0002:00:00.0", 0, "SYS");
    expect_code(t, "0001:00:00.0", "eth0", 1, "NODE");
    expect_code(t, "0002:00:00.0", "eth0", 1, "SYS");
    const int four[4] = {0, 1, 2, 3};
    expect_islands(t, four, 4);
    mt_topo_destroy(t);
}

/* DGX-2 (hwloc): every V100 has 6 NVLinks, one into each of 6 NVSwitches of its baseboard (the
 * NVLinkBandwidth matrix: 25000 MB/s per GPU-switch entry, NVLink 2.0), and the two baseboards'
 * switches are joined, so every pair is NV6 and the 16 GPUs are one island. The PCIe paths below
 * the NVLink codes are still read from the tree: GPUs 34:00.0 and 36:00.0 hang off downstream
 * ports 33:00.0/33:10.0 of one PLX switch (upstream 32:00.0); 39:00.0 is under the sibling switch
 * 37:00.0, both below switch 2c:00.0; 57:00.0 is under another host bridge of NUMA node 0;
 * b7:00.0 is in NUMA node 1. */
static void test_dgx2(void) {
    mt_topo *t = load_fixture("hwloc-nvidia-dgx2-v100-nvswitch.v2.xml");
    if (!t) return;
    CHECK_MSG(t->n_gpus == 16, "DGX-2: %zu GPUs", t->n_gpus);
    for (size_t i = 0; i < t->n_gpus; i++) {
        CHECK_MSG(t->gpus[i].nvlink_known && mt_topo_gpu_nvlinks(t, i) == 6,
                  "DGX-2 GPU%zu: known=%d, %d NVLinks, expected 6", i, t->gpus[i].nvlink_known,
                  mt_topo_gpu_nvlinks(t, i));
        for (size_t j = 0; j < t->n_gpus; j++) {
            char got[16];
            mt_topo_conn_str(mt_topo_gpu_gpu(t, i, j), got, sizeof(got));
            CHECK_MSG(strcmp(got, i == j ? "X" : "NV6") == 0, "DGX-2 GPU%zu-GPU%zu is %s", i, j,
                      got);
        }
    }
    const int one[16] = {0};
    expect_islands(t, one, 1);
    expect_tp(t, 2, consecutive, 8);
    expect_tp(t, 4, consecutive, 4);
    expect_tp(t, 8, consecutive, 2);
    mt_topo_destroy(t);
}

/* IBM POWER8 Minsky (hwloc): NVLinkBandwidth gives 40000 MB/s (2 NVLink 1.0 links) between GPUs
 * 0002:01 and 0003:01, and between 000a:01 and 000b:01, and as much from each GPU to its CPU
 * package; the pairs are on different packages (NUMA nodes 0 and 1). */
static void test_minsky(void) {
    mt_topo *t = load_fixture("hwloc-ibm-power8-minsky-4xP100-nvlink.v2.xml");
    if (!t) return;
    expect_code(t, "0002:01:00.0", "0003:01:00.0", 0, "NV2");
    expect_code(t, "000a:01:00.0", "000b:01:00.0", 0, "NV2");
    expect_code(t, "0002:01:00.0", "000a:01:00.0", 0, "SYS");
    expect_code(t, "0003:01:00.0", "000b:01:00.0", 0, "SYS");
    for (size_t i = 0; i < t->n_gpus; i++) {
        int cpu = 0;
        for (size_t l = 0; l < t->gpus[i].n_links; l++)
            if (t->gpus[i].links[l].kind == MT_TOPO_LINK_OTHER) cpu += t->gpus[i].links[l].count;
        CHECK_MSG(cpu == 2, "Minsky GPU%zu has %d NVLinks to its CPU, expected 2", i, cpu);
        /* CPU links are not GPU-to-GPU NVLinks */
        CHECK_MSG(mt_topo_gpu_nvlinks(t, i) == 2, "Minsky GPU%zu: %d NVLinks", i,
                  mt_topo_gpu_nvlinks(t, i));
    }
    const int pairs[4] = {0, 0, 1, 1};
    expect_islands(t, pairs, 2);
    expect_tp(t, 2, consecutive, 2);
    mt_topo_destroy(t);
}

/* AWS p4d (hwloc, no NVLink data): GPUs 10:1c.0 and 10:1d.0 and the EFA 10:1b.0 sit directly on
 * the host bridge of bus 10; bus 20 is another host bridge of the same package/NUMA node. */
static void test_p4d(void) {
    mt_topo *t = load_fixture("hwloc-aws-p4d.24xl-nixl.xml");
    if (!t) return;
    CHECK(t->gpus[0].nvlink_known == 0);
    expect_code(t, "0000:10:1c.0", "0000:10:1d.0", 0, "PHB");
    expect_code(t, "0000:10:1c.0", "0000:20:1c.0", 0, "NODE");
    expect_code(t, "0000:10:1c.0", "0000:90:1c.0", 0, "SYS");
    expect_code(t, "0000:10:1c.0", "0000:10:1b.0", 1, "PHB");
    mt_topo_destroy(t);
}

/* A built model: four GPUs of one NUMA node on one host bridge, NVLinked in pairs 0-2 and 1-3
 * (4 links each way): tp=2 must keep the pairs. */
static void test_pairs_built(void) {
    mt_topo *t = NULL;
    CHECK_OK(mt_topo_create("built", &t));
    if (!t) return;
    int hb = -1;
    CHECK_OK(mt_topo_add_cpuset(t, 0, 0, "0-7"));
    CHECK_OK(mt_topo_add_pci(t, "0000:00", MT_TOPO_PCI_HOST_BRIDGE, -1, 0x060000, 0, &hb));
    static const char *bus[4] = {"0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"};
    for (int i = 0; i < 4; i++) {
        int p = -1;
        CHECK_OK(mt_topo_add_pci(t, bus[i], MT_TOPO_PCI_DEVICE, hb, 0x030200, 0, &p));
        CHECK_OK(mt_topo_add_gpu(t, i, bus[i], "GPU", 0, "0-7", p, NULL));
    }
    /* links added after all GPUs exist: gpus[] may move while it grows */
    for (int i = 0; i < 4; i++) {
        CHECK_OK(mt_topo_gpu_add_link(t, &t->gpus[i], bus[(i + 2) % 4], MT_TOPO_LINK_GPU, 4));
    }
    CHECK_OK(mt_topo_finish(t));
    expect_code(t, bus[0], bus[2], 0, "NV4");
    expect_code(t, bus[0], bus[1], 0, "PHB");
    const int isl[4] = {0, 1, 0, 1};
    expect_islands(t, isl, 2);
    const int tp2[4] = {0, 2, 1, 3};
    expect_tp(t, 2, tp2, 2);
    expect_tp(t, 4, consecutive, 1);
    expect_tp(t, 3, NULL, 0); /* does not divide 4 */
    expect_tp(t, 8, NULL, 0);
    mt_topo_destroy(t);
}

/* Built: switch link totals differ (12 and 18): the pair gets the smaller; a direct-only GPU
 * pair elsewhere; NCCL-style nesting (no host bridge) gives PXB across two child bridges. */
static void test_switch_min_built(void) {
    mt_topo *t = NULL;
    CHECK_OK(mt_topo_create("built", &t));
    if (!t) return;
    int top = -1, b1 = -1, b2 = -1, p0 = -1, p1 = -1;
    CHECK_OK(mt_topo_add_cpuset(t, 0, 0, "0-7"));
    CHECK_OK(mt_topo_add_pci(t, "0000:10:00.0", MT_TOPO_PCI_BRIDGE, -1, 0x060400, 0, &top));
    CHECK_OK(mt_topo_add_pci(t, "0000:11:00.0", MT_TOPO_PCI_BRIDGE, top, 0x060400, 0, &b1));
    CHECK_OK(mt_topo_add_pci(t, "0000:12:00.0", MT_TOPO_PCI_BRIDGE, top, 0x060400, 0, &b2));
    CHECK_OK(mt_topo_add_pci(t, "0000:13:00.0", MT_TOPO_PCI_DEVICE, b1, 0x030200, 0, &p0));
    CHECK_OK(mt_topo_add_pci(t, "0000:14:00.0", MT_TOPO_PCI_DEVICE, b2, 0x030200, 0, &p1));
    CHECK_OK(mt_topo_add_gpu(t, 0, "0000:13:00.0", "GPU", 0, "0-7", p0, NULL));
    CHECK_OK(mt_topo_add_gpu(t, 1, "0000:14:00.0", "GPU", 0, "0-7", p1, NULL));
    CHECK_OK(mt_topo_finish(t));
    expect_code(t, "0000:13:00.0", "0000:14:00.0", 0, "PXB");
    CHECK_OK(mt_topo_gpu_add_link(t, &t->gpus[0], "switch", MT_TOPO_LINK_SWITCH, 12));
    CHECK_OK(mt_topo_gpu_add_link(t, &t->gpus[1], "switch", MT_TOPO_LINK_SWITCH, 6));
    CHECK_OK(mt_topo_gpu_add_link(t, &t->gpus[1], "switch", MT_TOPO_LINK_SWITCH, 12));
    expect_code(t, "0000:13:00.0", "0000:14:00.0", 0, "NV12");
    CHECK(mt_topo_gpu_nvlinks(t, 1) == 18);
    mt_topo_destroy(t);
}

int main(void) {
    test_ibm_h100();
    test_2xa100_pcie();
    test_ndv4();
    test_ndv5();
    test_ncv4_self_links();
    test_dgx2();
    test_minsky();
    test_p4d();
    test_pairs_built();
    test_switch_min_built();
    return check_report("test_topo_classify");
}
