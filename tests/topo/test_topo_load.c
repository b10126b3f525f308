/* Loading topology files: every real machine file in tests/fixtures/topologies/ (the expected
 * facts below were read from the files themselves), and each kind of bad input. */
#include "check.h"
#include "topo_fixture.h"
#include "topo/topology.h"

#include <meshtrain/status.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


typedef struct expect {
    const char *file;
    size_t numa, gpus, nics, switches;
    const char *gpu0_busid, *gpu_last_busid;
    size_t nvlink_bw_n;
} expect;

/* Counts: hwloc files by PCIDev objects (NVIDIA class 0300/0302 = GPU; with an OpenFabrics OS
 * device = NIC, the AWS files' network-only ENA functions being dropped next to them; subtype
 * NVSwitch); NCCL files by <pci> class and <net> entries. */
static const expect files[] = {
    {"hwloc-aws-g5.48xl-nixl.xml", 2, 8, 1, 0, "0000:00:16.0", "0000:00:1d.0", 0},
    {"hwloc-aws-g6.48xl-nixl.xml", 2, 8, 1, 0, "0000:9f:00.0", "0000:b4:00.0", 0},
    {"hwloc-aws-p3dn.24xl-nixl.xml", 2, 8, 1, 0, "0000:00:16.0", "0000:00:1d.0", 0},
    {"hwloc-aws-p4d.24xl-nixl.xml", 2, 8, 4, 0, "0000:10:1c.0", "0000:a0:1d.0", 0},
    {"hwloc-aws-p5.48xl-nixl.xml", 2, 8, 32, 0, "0000:53:00.0", "0000:ca:00.0", 0},
    {"hwloc-aws-p5en.48xl-nixl.xml", 2, 8, 16, 0, "0000:59:00.0", "0000:a5:00.0", 0},
    {"hwloc-aws-p6-b200.48xl-nixl.xml", 2, 8, 10, 0, "0000:51:00.0", "0000:87:00.0", 0},
    {"hwloc-ibm-power8-minsky-4xP100-nvlink.v2.xml", 2, 4, 0, 0, "0002:01:00.0", "000b:01:00.0",
     6},
    {"hwloc-nvidia-dgx2-v100-nvswitch.v2.xml", 2, 16, 0, 12, "0000:34:00.0", "0000:e7:00.0", 28},
    {"nccl-azure-ncv4-a100x4-topo.xml", 4, 4, 1, 0, "0001:00:00.0", "0004:00:00.0", 0},
    {"nccl-azure-ndv2-v100x8-topo.xml", 2, 8, 1, 0, "0001:00:00.0", "0008:00:00.0", 0},
    {"nccl-azure-ndv4-a100x8-topo.xml", 4, 8, 8, 0, "0001:00:00.0", "000e:00:00.0", 0},
    {"nccl-azure-ndv5-h100x8-topo.xml", 2, 8, 8, 0, "0001:00:00.0", "000c:00:00.0", 0},
    {"nccl-ibmcloud-gx3d-h100x8-vsi-topo.xml", 2, 8, 8, 4, "0000:a4:00.0", "0000:ea:00.0", 0},
    {"nccl-issue2397-2xA100pcie-cx6dx-icelake-hostA.xml", 2, 2, 2, 0, "0000:69:00.0",
     "0000:b1:00.0", 0},
};

static const char *numa_cpus(const mt_topo *t, int id) {
    for (size_t i = 0; i < t->n_numa; i++)
        if (t->numa[i].id == id) return t->numa[i].cpus;
    return "(none)";
}

static const mt_topo_nic *nic_named(const mt_topo *t, const char *name) {
    for (size_t i = 0; i < t->n_nics; i++)
        if (strcmp(t->nics[i].name, name) == 0) return &t->nics[i];
    return NULL;
}

static void test_fixture_counts(void) {
    for (size_t f = 0; f < sizeof(files) / sizeof(files[0]); f++) {
        const expect *e = &files[f];
        mt_topo *t = load_fixture(e->file);
        if (!t) continue;
        CHECK_MSG(t->n_numa == e->numa, "%s: %zu NUMA nodes", e->file, t->n_numa);
        CHECK_MSG(t->n_gpus == e->gpus, "%s: %zu GPUs", e->file, t->n_gpus);
        CHECK_MSG(t->n_nics == e->nics, "%s: %zu NICs", e->file, t->n_nics);
        CHECK_MSG(t->n_switches == e->switches, "%s: %zu switches", e->file, t->n_switches);
        CHECK_MSG(t->nvlink_bw_n == e->nvlink_bw_n, "%s: NVLinkBandwidth over %zu objects",
                  e->file, t->nvlink_bw_n);
        if (t->n_gpus == e->gpus && e->gpus > 0) {
            CHECK_MSG(strcmp(t->gpus[0].bus_id, e->gpu0_busid) == 0, "%s: GPU0 is %s", e->file,
                      t->gpus[0].bus_id);
            CHECK_MSG(strcmp(t->gpus[e->gpus - 1].bus_id, e->gpu_last_busid) == 0,
                      "%s: last GPU is %s", e->file, t->gpus[e->gpus - 1].bus_id);
        }
        for (size_t i = 0; i < t->n_gpus; i++) {
            CHECK_MSG(t->gpus[i].index == (int)i, "%s: gpus[%zu] has index %d", e->file, i,
                      t->gpus[i].index);
            CHECK(t->gpus[i].pci >= 0 && (size_t)t->gpus[i].pci < t->n_pci);
        }
        CHECK_MSG(strstr(t->source, e->file) != NULL, "%s: source %s", e->file, t->source);
        mt_topo_destroy(t);
    }
}

/* Facts read from the NCCL files: affinity masks turned into cpu lists, NVLink entries, names. */
static void test_nccl_facts(void) {
    mt_topo *t = load_fixture("nccl-ibmcloud-gx3d-h100x8-vsi-topo.xml");
    if (t) {
        CHECK(strcmp(numa_cpus(t, 0), "0-79") == 0);
        CHECK(strcmp(numa_cpus(t, 1), "80-159") == 0);
        for (size_t i = 0; i < t->n_gpus; i++) {
            const mt_topo_gpu *g = &t->gpus[i];
            int total = 0, switch_links = 0;
            for (size_t j = 0; j < g->n_links; j++) {
                total += g->links[j].count;
                switch_links += g->links[j].kind == MT_TOPO_LINK_SWITCH;
            }
            CHECK_MSG(g->n_links == 4 && switch_links == 4 && total == 18,
                      "IBM GPU %zu: %zu entries, %d to switches, %d links", i, g->n_links,
                      switch_links, total);
            CHECK(g->numa == (i < 4 ? 0 : 1));
            CHECK(strcmp(g->cpus, i < 4 ? "0-79" : "80-159") == 0);
        }
        CHECK(t->gpus[0].links[2].count == 4 && strcmp(t->gpus[0].links[2].target, "0000:f3:00.0") == 0);
        CHECK(strcmp(t->gpus[7].bus_id, "0000:ea:00.0") == 0);
        const mt_topo_nic *n = nic_named(t, "mlx5_0");
        CHECK(n && strcmp(n->bus_id, "0000:e9:00.0") == 0 && n->speed_mbps == 200000 && n->numa == 1);
        n = nic_named(t, "mlx5_7");
        CHECK(n && strcmp(n->bus_id, "0000:a3:00.0") == 0 && n->numa == 0);
        /* Each GPU sits beside its NIC under one bridge: both have that bridge as parent. */
        int gp = t->gpus[0].pci;
        CHECK(gp >= 0 && n && n->pci >= 0 && t->pci[gp].parent == t->pci[n->pci].parent);
        CHECK(gp >= 0 && t->pci[gp].parent >= 0 &&
              strcmp(t->pci[t->pci[gp].parent].bus_id, "0000:a1:00.0") == 0 &&
              t->pci[t->pci[gp].parent].kind == MT_TOPO_PCI_BRIDGE);
        mt_topo_destroy(t);
    }

    t = load_fixture("nccl-azure-ncv4-a100x4-topo.xml");
    if (t) {
        CHECK(strcmp(numa_cpus(t, 0), "0-23") == 0 && strcmp(numa_cpus(t, 1), "24-47") == 0 &&
              strcmp(numa_cpus(t, 2), "48-71") == 0 && strcmp(numa_cpus(t, 3), "72-95") == 0);
        for (size_t i = 0; i < t->n_gpus; i++) {
            const mt_topo_gpu *g = &t->gpus[i];
            /* Each GPU names itself with 12 links: kept, flagged as a self link. */
            CHECK_MSG(g->n_links == 1 && g->links[0].kind == MT_TOPO_LINK_SELF &&
                          g->links[0].count == 12,
                      "NC A100 v4 GPU %zu", i);
            CHECK(g->numa == (int)i);
        }
        const mt_topo_nic *n = nic_named(t, "eth0");
        CHECK(n && n->bus_id[0] == '\0' && n->speed_mbps == 100000 && n->numa == 0);
        mt_topo_destroy(t);
    }

    t = load_fixture("nccl-issue2397-2xA100pcie-cx6dx-icelake-hostA.xml");
    if (t) {
        CHECK(strcmp(numa_cpus(t, 0), "0-27,56-83") == 0);
        CHECK(strcmp(numa_cpus(t, 1), "28-55,84-111") == 0);
        CHECK(t->gpus[0].numa == 0 && t->gpus[1].numa == 1);
        CHECK(t->gpus[0].n_links == 0 && t->gpus[0].nvlink_known);
        const mt_topo_nic *n = nic_named(t, "mlx5_1");
        CHECK(n && strcmp(n->bus_id, "0000:16:00.0") == 0 && n->speed_mbps == 100000);
        mt_topo_destroy(t);
    }

    t = load_fixture("nccl-azure-ndv4-a100x8-topo.xml");
    if (t) {
        /* No <gpu dev>: indices follow bus order, so GPU0 (0001:00:00.0) sits on NUMA node 1. */
        CHECK(t->gpus[0].numa == 1 && strcmp(t->gpus[0].cpus, "24-47") == 0);
        CHECK(t->nics[0].name[0] == '\0' && strcmp(t->nics[0].bus_id, "0103:00:00.0") == 0);
        mt_topo_destroy(t);
    }

    t = load_fixture("nccl-azure-ndv5-h100x8-topo.xml");
    if (t) {
        CHECK(strcmp(numa_cpus(t, 0), "0-47") == 0 && strcmp(numa_cpus(t, 1), "48-95") == 0);
        mt_topo_destroy(t);
    }
}

static void test_hwloc_facts(void) {
    mt_topo *t = load_fixture("hwloc-nvidia-dgx2-v100-nvswitch.v2.xml");
    if (t) {
        CHECK(t->n_packages == 2);
        for (size_t i = 0; i < t->n_gpus; i++) CHECK(t->gpus[i].nvlink_known); /* from its NVLinkBandwidth matrix */
        /* The matrix is GPU-NVSwitch: some entry is non-zero. */
        uint64_t sum = 0;
        for (size_t i = 0; i < t->nvlink_bw_n * t->nvlink_bw_n; i++) sum += t->nvlink_bw[i];
        CHECK(sum > 0);
        /* Its rows are the 16 GPUs then the 12 NVSwitches, each labelled by its bus id. */
        for (size_t i = 0; i < t->nvlink_bw_n; i++) {
            int found = 0;
            for (size_t g = 0; g < t->n_gpus; g++)
                found |= i < 16 && strcmp(t->nvlink_bw_labels[i], t->gpus[g].bus_id) == 0;
            for (size_t w = 0; w < t->n_switches; w++)
                found |= i >= 16 && strcmp(t->nvlink_bw_labels[i], t->switches[w].bus_id) == 0;
            CHECK_MSG(found, "DGX-2 NVLinkBandwidth row %zu is %s", i, t->nvlink_bw_labels[i]);
        }
        mt_topo_destroy(t);
    }
    t = load_fixture("hwloc-ibm-power8-minsky-4xP100-nvlink.v2.xml");
    if (t && t->nvlink_bw_n == 6) {
        /* First row of the file's matrix: 1000000 40000 0 0 40000 0 (GPU, GPU, .., Package). */
        const uint64_t *row = t->nvlink_bw;
        CHECK(row[0] == 1000000 && row[1] == 40000 && row[2] == 0 && row[3] == 0 &&
              row[4] == 40000 && row[5] == 0);
        CHECK(strcmp(t->nvlink_bw_labels[0], t->gpus[0].bus_id) == 0);
        CHECK(strncmp(t->nvlink_bw_labels[4], "Package:", 8) == 0);
        CHECK(strcmp(t->gpus[0].name, "Tesla P100-SXM2-16GB") == 0);
    }
    mt_topo_destroy(t);
    t = load_fixture("hwloc-aws-p5.48xl-nixl.xml");
    if (t) {
        CHECK(nic_named(t, "rdmap79s0") != NULL);
        /* The ENA interface beside the EFA devices is a plain network device: not a NIC here. */
        CHECK(nic_named(t, "enp71s0") == NULL);
        for (size_t i = 0; i < t->n_nics; i++) CHECK(t->nics[i].fabric == 1);
        size_t hosts = 0;
        for (size_t i = 0; i < t->n_pci; i++) hosts += t->pci[i].kind == MT_TOPO_PCI_HOST_BRIDGE;
        CHECK(hosts > 0);
        mt_topo_destroy(t);
    }
}

/* ---- bad input ----------------------------------------------------------------------------- */

static char tmpdir[256];

static const mt_topo_pci *pci_at(const mt_topo *t, const char *busid) {
    for (size_t i = 0; i < t->n_pci; i++)
        if (strcmp(t->pci[i].bus_id, busid) == 0) return &t->pci[i];
    return NULL;
}

/* Checks every NUMA node's CPU identity ("" / -1: unknown). */
static void check_cpu(const char *file, const mt_topo *t, const char *arch, const char *vendor,
                      int family, int model) {
    for (size_t i = 0; i < t->n_numa; i++) {
        const mt_topo_cpu_id *c = &t->numa[i].cpu;
        CHECK_MSG(strcmp(c->arch, arch) == 0 && strcmp(c->vendor, vendor) == 0 &&
                      c->family == family && c->model == model,
                  "%s: NUMA node %d is '%s' '%s' %d %d, expected '%s' '%s' %d %d", file,
                  t->numa[i].id, c->arch, c->vendor, c->family, c->model, arch, vendor, family,
                  model);
    }
}

static void check_link(const char *file, const mt_topo *t, const char *busid, const char *speed,
                       int width, double gbps) {
    const mt_topo_pci *p = pci_at(t, busid);
    CHECK_MSG(p && strcmp(p->link_speed, speed) == 0 && p->link_width == width &&
                  (gbps == 0 ? p->link_gbps == 0
                             : p->link_gbps > gbps - 1e-4 && p->link_gbps < gbps + 1e-4),
              "%s: PCI %s link is '%s' x%d %.6f GB/s, expected '%s' x%d %.6f", file, busid,
              p ? p->link_speed : "(no entry)", p ? p->link_width : -2, p ? p->link_gbps : -1.0,
              speed, width, gbps);
}

/* CPU identity and PCIe links as each file writes them (values read from the files): NCCL's
 * <cpu arch vendor familyid modelid> and <pci link_speed link_width>; hwloc's root
 * "Architecture" (ppc64le is NCCL's ppc64), package CPUVendor/CPUFamilyNumber/CPUModelNumber and
 * pci_link_speed (GB/s). The AWS captures have no CPU side: unknown, not guessed. */
static void test_cpu_and_links(void) {
    static const struct {
        const char *file, *arch, *vendor;
        int family, model;
        const char *busid, *speed;
        int width;
        double gbps;
    } cases[] = {
        {"nccl-ibmcloud-gx3d-h100x8-vsi-topo.xml", "x86_64", "GenuineIntel", 6, 143, "0000:a4:00.0",
         "32.0 GT/s PCIe", 0, 0},
        {"nccl-issue2397-2xA100pcie-cx6dx-icelake-hostA.xml", "x86_64", "GenuineIntel", 6, 106,
         "0000:16:00.0", "16.0 GT/s PCIe", 8, 0},
        {"nccl-azure-ncv4-a100x4-topo.xml", "x86_64", "AuthenticAMD", 175, 1, "0001:00:00.0", "",
         0, 0},
        {"nccl-azure-ndv2-v100x8-topo.xml", "x86_64", "GenuineIntel", 6, 85, "0001:00:00.0",
         "16 GT/s", 16, 0},
        {"hwloc-nvidia-dgx2-v100-nvswitch.v2.xml", "x86_64", "GenuineIntel", 6, 85, "0000:34:00.0",
         "", -1, 15.753846},
        {"hwloc-ibm-power8-minsky-4xP100-nvlink.v2.xml", "ppc64", "", -1, -1, "0002:00:00.0", "",
         -1, 7.876923},
        {"hwloc-aws-p4d.24xl-nixl.xml", "", "", -1, -1, "0000:10:1c.0", "", -1, 31.507692},
        {"hwloc-aws-p5.48xl-nixl.xml", "", "", -1, -1, "0000:53:00.0", "", -1, 63.015385},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        mt_topo *t = load_fixture(cases[i].file);
        if (!t) continue;
        CHECK_MSG(t->n_numa > 0, "%s: no NUMA node", cases[i].file);
        check_cpu(cases[i].file, t, cases[i].arch, cases[i].vendor, cases[i].family,
                  cases[i].model);
        check_link(cases[i].file, t, cases[i].busid, cases[i].speed, cases[i].width,
                   cases[i].gbps);
        mt_topo_destroy(t);
    }
    /* the 2xA100 host's GPUs are Gen4 x16, its NIC x8 */
    mt_topo *t = load_fixture("nccl-issue2397-2xA100pcie-cx6dx-icelake-hostA.xml");
    if (t) check_link("issue2397", t, "0000:69:00.0", "16.0 GT/s PCIe", 16, 0);
    mt_topo_destroy(t);
}

static void write_file(const char *name, const char *text, char *path, size_t size) {
    snprintf(path, size, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void expect_fail(const char *name, const char *text, mt_status want) {
    char path[512];
    write_file(name, text, path, sizeof(path));
    mt_topo *t = (mt_topo *)&t;
    mt_status s = mt_topo_load_file(path, &t);
    CHECK_MSG(s == want, "%s: got %s (%s)", name, mt_status_str(s), mt_last_error());
    CHECK_MSG(t == NULL, "%s: output not cleared", name);
    CHECK_MSG(strstr(mt_last_error(), path) != NULL, "%s: message '%s' names no file", name,
              mt_last_error());
    if (s == MT_OK) mt_topo_destroy(t);
    unlink(path);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* An NCCL file whose <system> asks, through mt_* attributes (mt-topo's export), for more packages
 * or cores than there are CPU numbers: refused quickly, naming the attribute. Each item alone is
 * valid; only the total is too much (a 20 KB file of "0:0*32768" items took 42 s and 7.8 GB). */
static void expect_cpusets_capped(const char *name, const char *attr, const char *item,
                                  int items, const char *message) {
    size_t len = strlen(item) + 1, cap = (size_t)items * len + 256;
    char *text = malloc(cap);
    CHECK(text != NULL);
    if (!text) return;
    size_t n = (size_t)snprintf(text, cap, "<system version=\"1\" %s=\"", attr);
    for (int i = 0; i < items; i++)
        n += (size_t)snprintf(text + n, cap - n, "%s%s", i ? ";" : "", item);
    snprintf(text + n, cap - n, "\"><cpu numaid=\"0\" affinity=\"0000000f\"/></system>");
    double t0 = now_s();
    expect_fail(name, text, MT_ERR_INVALID_ARG);
    double secs = now_s() - t0;
    CHECK_MSG(strstr(mt_last_error(), message) != NULL, "%s: '%s' lacks '%s'", name,
              mt_last_error(), message);
    CHECK_MSG(secs < 5.0, "%s: refused after %.1f s", name, secs);
    free(text);
}

#define GPU_PCI(bus, body)                                                                         \
    "<pci busid=\"" bus "\" class=\"0x030200\"><gpu dev=\"0\">" body "</gpu></pci>"

static void test_bad_input(void) {
    snprintf(tmpdir, sizeof(tmpdir), "%s/mt_topo_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    CHECK(mkdtemp(tmpdir) != NULL);

    expect_fail("malformed.xml", "<system><cpu numaid=\"0\"></system>", MT_ERR_INVALID_ARG);
    expect_fail("empty.xml", "", MT_ERR_INVALID_ARG);
    expect_fail("root.xml", "<machine><cpu/></machine>", MT_ERR_INVALID_ARG);
    expect_fail("no_gpu_target.xml",
                "<system><cpu numaid=\"0\">" GPU_PCI(
                    "0000:01:00.0", "<nvlink target=\"0000:02:00.0\" count=\"2\" tclass=\"0x030200\"/>")
                "</cpu></system>",
                MT_ERR_INVALID_ARG);
    expect_fail("huge_count.xml",
                "<system><cpu numaid=\"0\">" GPU_PCI(
                    "0000:01:00.0", "<nvlink target=\"0000:f0:00.0\" count=\"100000\" tclass=\"0x068000\"/>")
                "</cpu></system>",
                MT_ERR_INVALID_ARG);
    expect_fail("neg_count.xml",
                "<system><cpu numaid=\"0\">" GPU_PCI(
                    "0000:01:00.0", "<nvlink target=\"0000:f0:00.0\" count=\"-3\" tclass=\"0x068000\"/>")
                "</cpu></system>",
                MT_ERR_INVALID_ARG);
    expect_fail("huge_numa.xml", "<system><cpu numaid=\"99999999\"/></system>", MT_ERR_INVALID_ARG);
    expect_fail("bad_affinity.xml", "<system><cpu numaid=\"0\" affinity=\"zz,ff\"/></system>",
                MT_ERR_INVALID_ARG);
    expect_fail("dup_dev.xml",
                "<system><cpu numaid=\"0\">" GPU_PCI("0000:01:00.0", "") GPU_PCI("0000:02:00.0", "")
                "</cpu></system>",
                MT_ERR_INVALID_ARG);
    expect_fail("bad_family.xml", "<system><cpu numaid=\"0\" familyid=\"six\"/></system>",
                MT_ERR_INVALID_ARG);
    expect_fail("long_vendor.xml",
                "<system><cpu numaid=\"0\" arch=\"x86_64\" "
                "vendor=\"GenuineIntelGenuineIntelGenuineIntel\"/></system>",
                MT_ERR_INVALID_ARG);
    expect_fail("neg_width.xml",
                "<system><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\" class=\"0x060400\" "
                "link_speed=\"8 GT/s\" link_width=\"-4\"/></cpu></system>",
                MT_ERR_INVALID_ARG);
    expect_fail("long_speed.xml",
                "<system><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\" class=\"0x060400\" "
                "link_speed=\"16.0 GT/s PCIe 16.0 GT/s PCIe 16.0 GT/s\" link_width=\"16\"/>"
                "</cpu></system>",
                MT_ERR_INVALID_ARG);
    expect_fail("bad_hwloc.xml", "<topology version=\"2.0\"><object type=\"Bogus\"/></topology>",
                MT_ERR_INVALID_ARG);
    expect_cpusets_capped("cores_capped.xml", "mt_cores", "0:0*32768", 2,
                          "mt_cores lists more than 32768 cores");
    expect_cpusets_capped("cores_many.xml", "mt_cores", "0:0-1*16384", 8,
                          "mt_cores lists more than 32768 cores");
    expect_cpusets_capped("packages_capped.xml", "mt_packages", "0:0", 32769,
                          "mt_packages lists more than 32768 packages");

    /* Truncated: the first half of a real file. */
    char src[512];
    snprintf(src, sizeof(src), "%s/nccl-ibmcloud-gx3d-h100x8-vsi-topo.xml", MT_TOPO_FIXTURES);
    FILE *f = fopen(src, "r");
    CHECK(f != NULL);
    if (f) {
        static char half[8192];
        size_t n = fread(half, 1, sizeof(half) - 1, f);
        fclose(f);
        half[n / 2] = '\0';
        expect_fail("truncated.xml", half, MT_ERR_INVALID_ARG);
    }

    /* A GPU naming itself is tolerated. */
    char path[512];
    write_file("self.xml",
               "<system><cpu numaid=\"0\" affinity=\"0000000f\">" GPU_PCI(
                   "0000:01:00.0", "<nvlink target=\"0000:01:00.0\" count=\"4\" tclass=\"0x030200\"/>")
               "</cpu></system>",
               path, sizeof(path));
    mt_topo *t = NULL;
    CHECK_OK(mt_topo_load_file(path, &t));
    CHECK(t && t->n_gpus == 1 && t->gpus[0].n_links == 1 &&
          t->gpus[0].links[0].kind == MT_TOPO_LINK_SELF && strcmp(t->gpus[0].cpus, "0-3") == 0);
    mt_topo_destroy(t);
    unlink(path);

    /* Over 64 MiB (sparse, so the test stays cheap): refused before reading. */
    snprintf(path, sizeof(path), "%s/huge.xml", tmpdir);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)100 << 20) == 0);
    if (fd >= 0) close(fd);
    t = NULL;
    CHECK(mt_topo_load_file(path, &t) == MT_ERR_INVALID_ARG && t == NULL);
    CHECK(strstr(mt_last_error(), path) != NULL);
    unlink(path);

    /* A directory, and a missing file. */
    CHECK(mt_topo_load_file(tmpdir, &t) == MT_ERR_INVALID_ARG && t == NULL);
    CHECK(strstr(mt_last_error(), "directory") != NULL);
    snprintf(path, sizeof(path), "%s/missing.xml", tmpdir);
    CHECK(mt_topo_load_file(path, &t) == MT_ERR_NOT_FOUND && t == NULL);
    CHECK(strstr(mt_last_error(), path) != NULL);

    rmdir(tmpdir);
}

int main(void) {
    test_fixture_counts();
    test_nccl_facts();
    test_hwloc_facts();
    test_cpu_and_links();
    test_bad_input();
    return check_report("test_topo_load");
}
