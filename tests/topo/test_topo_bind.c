/* Binding plans (topo/bind.c) on real topology files and on small built models. Expected cpus
 * come from the files: NDv2's <cpu numaid="0" affinity="...000fffff"> is cpus 0-19 with GPUs
 * 0-3 below it; NDv4 puts GPU 0 (0001:00:00.0) under numaid 1 (cpus 24-47); the POWER8 Minsky
 * file has 4 two-thread cores per NUMA node and GPUs 0-1 on node 0; the trimmed DGX-2 file keeps
 * 2 single-PU cores per node for 8 GPUs each. */
#include "check.h"
#include "topo_fixture.h"
#include "topo/bind.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define MAXCPU 4096

/* The test's own cpu list reader, independent of the one under test. */
static bool parse_list(const char *s, bool *set) {
    memset(set, 0, MAXCPU * sizeof *set);
    while (s && *s) {
        int lo, hi, n;
        if (sscanf(s, "%d-%d%n", &lo, &hi, &n) == 2) {
        } else if (sscanf(s, "%d%n", &lo, &n) == 1) {
            hi = lo;
        } else {
            return false;
        }
        if (lo < 0 || hi < lo || hi >= MAXCPU) return false;
        for (int c = lo; c <= hi; c++) set[c] = true;
        s += n;
        if (*s == ',') s++;
        else if (*s) return false;
    }
    return true;
}

static bool a_[MAXCPU], b_[MAXCPU];

static bool lists_disjoint(const char *a, const char *b) {
    if (!parse_list(a, a_) || !parse_list(b, b_)) return false;
    for (int c = 0; c < MAXCPU; c++)
        if (a_[c] && b_[c]) return false;
    return true;
}

static bool list_within(const char *a, const char *b) {
    if (!parse_list(a, a_) || !parse_list(b, b_)) return false;
    for (int c = 0; c < MAXCPU; c++)
        if (a_[c] && !b_[c]) return false;
    return true;
}

static mt_bind_plan *plan_within(const mt_topo *t, size_t n, const int *gpus, mt_bind_mode mode,
                                 const char *allowed) {
    mt_bind_plan *p = NULL;
    mt_status s = mt_bind_plan_make(t, n, gpus, mode, allowed, &p);
    CHECK_MSG(s == MT_OK && p, "%s: %s", t->source, mt_last_error());
    return s == MT_OK ? p : NULL;
}

static mt_bind_plan *plan_for(const mt_topo *t, size_t n, const int *gpus, mt_bind_mode mode) {
    mt_bind_plan *p = NULL;
    mt_status s = mt_bind_plan_make(t, n, gpus, mode, NULL, &p);
    CHECK_MSG(s == MT_OK && p, "%s: %s", t->source, mt_last_error());
    return s == MT_OK ? p : NULL;
}

/* Plans with the default GPU assignment (local rank i -> GPU i % n). */
static mt_bind_plan *plan_default(const mt_topo *t, size_t n, mt_bind_mode mode) {
    int *gpus = NULL;
    CHECK_OK(mt_bind_default_gpus(t, n, &gpus));
    mt_bind_plan *p = plan_for(t, n, gpus, mode);
    free(gpus);
    return p;
}

static void expect_rank(const mt_bind_plan *p, size_t r, const char *cpus, int numa,
                        const char *desc_part) {
    const mt_bind_rank *k = &p->ranks[r];
    CHECK_MSG(k->cpus && strcmp(k->cpus, cpus) == 0, "rank %zu: cpus %s, expected %s", r,
              k->cpus ? k->cpus : "(none)", cpus);
    if (numa >= 0)
        CHECK_MSG(k->n_numa == 1 && k->numa[0] == numa, "rank %zu: %zu memory node(s), first %d, "
                  "expected node %d", r, k->n_numa, k->n_numa ? k->numa[0] : -1, numa);
    CHECK_MSG(k->desc && strstr(k->desc, desc_part), "rank %zu: '%s' lacks '%s'", r,
              k->desc ? k->desc : "", desc_part);
}

static void test_ndv2_numa(void) {
    mt_topo *t = load_fixture("nccl-azure-ndv2-v100x8-topo.xml");
    if (!t) return;
    CHECK(mt_bind_default_mode(t) == MT_BIND_NUMA);
    mt_bind_plan *p = plan_default(t, 8, MT_BIND_NUMA);
    if (p) {
        for (size_t r = 0; r < 4; r++) expect_rank(p, r, "0-19", 0, "NUMA node 0 (cpus 0-19");
        for (size_t r = 4; r < 8; r++) expect_rank(p, r, "20-39", 1, "NUMA node 1 (cpus 20-39");
        CHECK(strcmp(p->ranks[3].desc, "NUMA node 0 (cpus 0-19, nearest GPU 3)") == 0);
        CHECK(p->warning == NULL);
    }
    mt_bind_plan_destroy(p);
    mt_topo_destroy(t);
}

/* No cores in an NCCL file: each node's cpu list is split, and the description says so. */
static void test_ndv2_core_split(void) {
    mt_topo *t = load_fixture("nccl-azure-ndv2-v100x8-topo.xml");
    if (!t) return;
    mt_bind_plan *p = plan_default(t, 8, MT_BIND_CORE);
    if (p) {
        const char *want[8] = {"0-4", "5-9", "10-14", "15-19", "20-24", "25-29", "30-34", "35-39"};
        for (size_t r = 0; r < 8; r++) expect_rank(p, r, want[r], r < 4 ? 0 : 1, "no core information");
        CHECK(strstr(p->ranks[0].desc, "5 cpus of NUMA node 0") != NULL);
    }
    mt_bind_plan_destroy(p);
    mt_topo_destroy(t);
}

static void test_ndv4_gpu_node(void) {
    mt_topo *t = load_fixture("nccl-azure-ndv4-a100x8-topo.xml");
    if (!t) return;
    mt_bind_plan *p = plan_default(t, 8, MT_BIND_NUMA);
    if (p) {
        expect_rank(p, 0, "24-47", 1, "NUMA node 1");
        expect_rank(p, 2, "0-23", 0, "NUMA node 0");
    }
    mt_bind_plan_destroy(p);
    mt_topo_destroy(t);
}

/* Whole two-thread cores, split evenly among the ranks whose GPUs share a node. */
static void test_minsky_cores(void) {
    mt_topo *t = load_fixture("hwloc-ibm-power8-minsky-4xP100-nvlink.v2.xml");
    if (!t) return;
    mt_bind_plan *p = plan_default(t, 4, MT_BIND_CORE);
    if (p) {
        expect_rank(p, 0, "0-1,8-9", 0, "2 cores of NUMA node 0");
        expect_rank(p, 1, "16-17,24-25", 0, "nearest GPU 1");
        expect_rank(p, 2, "80-81,88-89", 1, "2 cores of NUMA node 1");
        expect_rank(p, 3, "96-97,104-105", 1, "nearest GPU 3");
        CHECK(p->warning == NULL);
    }
    mt_bind_plan_destroy(p);
    /* The placement is an input: GPUs 0 and 2 give each rank a node's four cores. */
    int gpus[2] = {0, 2};
    p = plan_for(t, 2, gpus, MT_BIND_CORE);
    if (p) {
        expect_rank(p, 0, "0-1,8-9,16-17,24-25", 0, "4 cores of NUMA node 0");
        expect_rank(p, 1, "80-81,88-89,96-97,104-105", 1, "nearest GPU 2");
    }
    mt_bind_plan_destroy(p);
    mt_topo_destroy(t);
}

/* 8 ranks on a node with 2 cores: shared round-robin, one warning. */
static void test_dgx2_round_robin(void) {
    mt_topo *t = load_fixture("hwloc-nvidia-dgx2-v100-nvswitch.v2.xml");
    if (!t) return;
    mt_bind_plan *p = plan_default(t, 16, MT_BIND_CORE);
    if (p) {
        for (size_t r = 0; r < 8; r++) expect_rank(p, r, r % 2 ? "1" : "0", 0, "shared round-robin");
        for (size_t r = 8; r < 16; r++) expect_rank(p, r, r % 2 ? "25" : "24", 1, "NUMA node 1");
        CHECK_MSG(p->warning && strstr(p->warning, "8 local ranks share the 2 cores of NUMA node 0 "
                                       "round-robin") && strstr(p->warning, "1 other"),
                  "warning: %s", p->warning ? p->warning : "(none)");
    }
    mt_bind_plan_destroy(p);
    mt_topo_destroy(t);
}

/* Two NUMA nodes of four single-thread cores, and a CPU-less memory node that must be skipped. */
static mt_topo *cpu_only_model(void) {
    mt_topo *t = NULL;
    CHECK_OK(mt_topo_create("synthetic", &t));
    if (!t) return NULL;
    CHECK_OK(mt_topo_add_cpuset(t, 1, 0, "0-7"));
    CHECK_OK(mt_topo_add_cpuset(t, 0, 0, "0-3"));
    CHECK_OK(mt_topo_add_cpuset(t, 0, 1, "4-7"));
    CHECK_OK(mt_topo_add_cpuset(t, 0, 2, ""));
    for (int c = 0; c < 8; c++) {
        char cpu[8];
        snprintf(cpu, sizeof cpu, "%d", c);
        CHECK_OK(mt_topo_add_core(t, c / 4, cpu));
    }
    CHECK_OK(mt_topo_finish(t));
    return t;
}

static void test_spread_without_gpus(void) {
    mt_topo *t = cpu_only_model();
    if (!t) return;
    CHECK(mt_bind_default_mode(t) == MT_BIND_NONE);
    int dummy = 0, *gpus = &dummy;
    CHECK_OK(mt_bind_default_gpus(t, 4, &gpus));
    CHECK(gpus == NULL);
    mt_bind_plan *p = plan_for(t, 4, NULL, MT_BIND_NUMA);
    if (p) {
        expect_rank(p, 0, "0-3", 0, "NUMA node 0 (cpus 0-3)");
        expect_rank(p, 1, "0-3", 0, "NUMA node 0");
        expect_rank(p, 2, "4-7", 1, "NUMA node 1 (cpus 4-7)");
        expect_rank(p, 3, "4-7", 1, "NUMA node 1");
        CHECK(strstr(p->ranks[0].desc, "GPU") == NULL);
    }
    mt_bind_plan_destroy(p);
    p = plan_for(t, 3, NULL, MT_BIND_CORE);
    if (p) { /* two ranks on node 0, one on node 1 */
        expect_rank(p, 0, "0-1", 0, "2 cores of NUMA node 0");
        expect_rank(p, 1, "2-3", 0, "2 cores of NUMA node 0");
        expect_rank(p, 2, "4-7", 1, "4 cores of NUMA node 1");
    }
    mt_bind_plan_destroy(p);
    p = plan_for(t, 8, NULL, MT_BIND_CORE);
    if (p) {
        for (size_t r = 0; r < 8; r++) {
            char c[8];
            snprintf(c, sizeof c, "%zu", r);
            expect_rank(p, r, c, (int)r / 4, "1 core of NUMA node");
        }
        CHECK(p->warning == NULL);
    }
    mt_bind_plan_destroy(p);
    p = plan_for(t, 10, NULL, MT_BIND_CORE);
    if (p) { /* 5 ranks per node of 4 cores */
        expect_rank(p, 0, "0", 0, "shared round-robin");
        expect_rank(p, 4, "0", 0, "shared round-robin");
        expect_rank(p, 5, "4", 1, "shared round-robin");
        expect_rank(p, 9, "4", 1, "shared round-robin");
        CHECK_MSG(p->warning && strstr(p->warning, "5 local ranks share the 4 cores of NUMA node 0")
                  && strstr(p->warning, "1 other"), "warning: %s", p->warning ? p->warning : "");
    }
    mt_bind_plan_destroy(p);
    p = plan_for(t, 2, NULL, MT_BIND_NONE);
    if (p) {
        CHECK(p->ranks[0].cpus == NULL && p->ranks[1].cpus == NULL);
        CHECK(strcmp(p->ranks[1].desc, "--bind none") == 0);
    }
    mt_bind_plan_destroy(p);
    mt_topo_destroy(t);
}

/* A GPU whose NUMA node is unknown binds to its affinity; one without either is left alone. */
static void test_gpu_without_node(void) {
    mt_topo *t = cpu_only_model();
    if (!t) return;
    CHECK_OK(mt_topo_add_gpu(t, 0, "0000:01:00.0", "g0", -1, "2-5", -1, NULL));
    CHECK_OK(mt_topo_add_gpu(t, 1, "0000:02:00.0", "g1", -1, "", -1, NULL));
    CHECK_OK(mt_topo_finish(t));
    int gpus[2] = {0, 1};
    mt_bind_plan *p = plan_for(t, 2, gpus, MT_BIND_NUMA);
    if (p) {
        expect_rank(p, 0, "2-5", -1, "the CPUs near GPU 0 (cpus 2-5, nearest GPU 0; its NUMA "
                                      "node is unknown)");
        CHECK_MSG(p->ranks[0].n_numa == 2 && p->ranks[0].numa[0] == 0 && p->ranks[0].numa[1] == 1,
                  "memory nodes of cpus 2-5: %zu", p->ranks[0].n_numa);
        CHECK(p->ranks[1].cpus == NULL);
        CHECK(p->ranks[1].desc && strstr(p->ranks[1].desc, "no CPU is known near GPU 1 (topology: synthetic)"));
    }
    mt_bind_plan_destroy(p);
    p = plan_for(t, 1, gpus, MT_BIND_CORE);
    if (p) expect_rank(p, 0, "2-5", -1, "4 cores of the CPUs near GPU 0");
    mt_bind_plan_destroy(p);
    mt_topo_destroy(t);
}

/* The launcher's own affinity (taskset, a batch system) bounds every plan. */
static void test_allowed(void) {
    mt_topo *t = load_fixture("hwloc-ibm-power8-minsky-4xP100-nvlink.v2.xml");
    int *gpus = NULL;
    if (t) {
        CHECK_OK(mt_bind_default_gpus(t, 4, &gpus));
        mt_bind_plan *p = plan_within(t, 4, gpus, MT_BIND_CORE, "0-1,8-9,16-17,80-81");
        if (p) { /* node 0 keeps 3 cores for 2 ranks; node 1 one core for 2 ranks */
            expect_rank(p, 0, "0-1", 0, "1 core of NUMA node 0");
            expect_rank(p, 1, "8-9,16-17", 0, "2 cores of NUMA node 0");
            expect_rank(p, 2, "80-81", 1, "shared round-robin");
            expect_rank(p, 3, "80-81", 1, "shared round-robin");
            CHECK(p->warning && strstr(p->warning, "2 local ranks share the 1 core of NUMA node 1"));
        }
        mt_bind_plan_destroy(p);
        free(gpus);
        mt_topo_destroy(t);
    }
    t = load_fixture("nccl-azure-ndv2-v100x8-topo.xml");
    if (t) {
        CHECK_OK(mt_bind_default_gpus(t, 8, &gpus));
        mt_bind_plan *p = plan_within(t, 8, gpus, MT_BIND_NUMA, "0-9,30-39");
        if (p) {
            expect_rank(p, 3, "0-9", 0, "NUMA node 0 (cpus 0-9, nearest GPU 3)");
            expect_rank(p, 4, "30-39", 1, "NUMA node 1 (cpus 30-39, nearest GPU 4)");
        }
        mt_bind_plan_destroy(p);
        p = plan_within(t, 8, gpus, MT_BIND_CORE, "0-19");
        if (p) {
            expect_rank(p, 0, "0-4", 0, "NUMA node 0");
            CHECK(p->ranks[4].cpus == NULL && p->ranks[7].cpus == NULL);
            CHECK_MSG(strcmp(p->ranks[4].desc, "none of the CPUs near GPU 4 may be used: only cpus "
                             "0-19 are allowed") == 0, "%s", p->ranks[4].desc);
        }
        mt_bind_plan_destroy(p);
        free(gpus);
        mt_topo_destroy(t);
    }
    t = cpu_only_model();
    if (t) {
        mt_bind_plan *p = plan_within(t, 2, NULL, MT_BIND_CORE, "5-7");
        if (p) { /* only node 1 has allowed cpus: both ranks go there */
            expect_rank(p, 0, "5", 1, "1 core of NUMA node 1");
            expect_rank(p, 1, "6-7", 1, "2 cores of NUMA node 1");
        }
        mt_bind_plan_destroy(p);
        mt_bind_plan *q = NULL;
        CHECK(mt_bind_plan_make(t, 1, NULL, MT_BIND_NUMA, "0-", &q) == MT_ERR_INVALID_ARG && !q);
        CHECK(strstr(mt_last_error(), "the allowed cpu set has a malformed cpu list '0-'"));
        mt_topo_destroy(t);
    }
}

static void test_errors(void) {
    mt_bind_mode m = MT_BIND_NONE;
    CHECK_OK(mt_bind_mode_parse("core", &m));
    CHECK(m == MT_BIND_CORE);
    CHECK_OK(mt_bind_mode_parse("numa", &m));
    CHECK(m == MT_BIND_NUMA && strcmp(mt_bind_mode_name(m), "numa") == 0);
    const char *bad[] = {"NUMA", "cores", "", "numa "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(mt_bind_mode_parse(bad[i], &m) == MT_ERR_INVALID_ARG);
        CHECK(strstr(mt_last_error(), "expected none, numa or core") != NULL);
    }
    mt_topo *t = load_fixture("nccl-azure-ndv2-v100x8-topo.xml");
    if (t) {
        mt_bind_plan *p = NULL;
        int gpus[2] = {0, 8};
        CHECK(mt_bind_plan_make(t, 2, gpus, MT_BIND_NUMA, NULL, &p) == MT_ERR_INVALID_ARG && !p);
        CHECK_MSG(strstr(mt_last_error(), "local rank 1 uses GPU 8"), "%s", mt_last_error());
        CHECK(mt_bind_plan_make(t, 0, NULL, MT_BIND_NUMA, NULL, &p) == MT_ERR_INVALID_ARG);
        int *g = NULL;
        CHECK_OK(mt_bind_default_gpus(t, 10, &g));
        CHECK(g && g[0] == 0 && g[7] == 7 && g[9] == 1);
        free(g);
        mt_topo_destroy(t);
    }
    /* A damaged cpu list is an error naming it, not a wrong plan. */
    const char *broken[] = {"0-", "a", "3-1", "0,,1", "99999999"};
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        mt_topo *b = NULL;
        CHECK_OK(mt_topo_create("broken", &b));
        if (!b) continue;
        CHECK_OK(mt_topo_add_cpuset(b, 0, 3, broken[i]));
        mt_bind_plan *p = NULL;
        mt_status s = mt_bind_plan_make(b, 1, NULL, MT_BIND_NUMA, NULL, &p);
        CHECK_MSG(s == MT_ERR_INVALID_ARG && !p, "'%s' accepted", broken[i]);
        CHECK_MSG(strstr(mt_last_error(), "NUMA node 3 has a malformed cpu list"), "%s",
                  mt_last_error());
        mt_topo_destroy(b);
    }
}

/* Every fixture: numa binds each rank within its GPU's NUMA node; core gives disjoint sets inside
 * it whenever there are no more ranks than cores. */
static void test_every_fixture(void) {
    DIR *d = opendir(MT_TOPO_FIXTURES);
    CHECK(d != NULL);
    if (!d) return;
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 4, ".xml")) continue;
        mt_topo *t = load_fixture(e->d_name);
        if (!t) continue;
        files++;
        size_t n = t->n_gpus ? t->n_gpus : 4;
        mt_bind_plan *pn = plan_default(t, n, MT_BIND_NUMA);
        mt_bind_plan *pc = plan_default(t, n, MT_BIND_CORE);
        for (size_t r = 0; pn && pc && r < n; r++) {
            const mt_bind_rank *a = &pn->ranks[r], *c = &pc->ranks[r];
            CHECK_MSG(a->cpus && c->cpus && *a->cpus && *c->cpus, "%s rank %zu unbound: %s",
                      e->d_name, r, a->desc);
            if (!a->cpus || !c->cpus) continue;
            CHECK_MSG(list_within(c->cpus, a->cpus), "%s rank %zu: core set %s outside %s",
                      e->d_name, r, c->cpus, a->cpus);
            for (size_t q = 0; q < r && !pc->warning; q++)
                if (pc->ranks[q].cpus && strcmp(pn->ranks[q].cpus, a->cpus) == 0)
                    CHECK_MSG(lists_disjoint(pc->ranks[q].cpus, c->cpus), "%s: ranks %zu and %zu "
                              "overlap: %s / %s", e->d_name, q, r, pc->ranks[q].cpus, c->cpus);
        }
        mt_bind_plan_destroy(pn);
        mt_bind_plan_destroy(pc);
        mt_topo_destroy(t);
    }
    closedir(d);
    CHECK_MSG(files == 15, "%d fixture files planned, expected 15", files);
}

int main(void) {
    test_ndv2_numa();
    test_ndv2_core_split();
    test_ndv4_gpu_node();
    test_minsky_cores();
    test_dgx2_round_robin();
    test_spread_without_gpus();
    test_gpu_without_node();
    test_allowed();
    test_errors();
    test_every_fixture();
    return check_report("test_topo_bind");
}
