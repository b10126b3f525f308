/* NVLink probing through NVML loaded at run time (topo/topo_nvml.c), for real: the AWS p4d
 * fixture (8 A100, no NVLink data in the file) is probed with MT_NVML_LIBRARY pointing at a fake
 * NVML (tests/topo/fake_nvml.c) describing NVSwitch, pairwise and failing machines. Live
 * discovery on this machine must not load NVML when it has no GPU, and stays quiet. */
#include "check.h"
#include "topo_fixture.h"
#include "topo/classify.h"
#include "topo/topo_nvml.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FAKE_NVML
#error "FAKE_NVML, FAKE_NVML_OLD and FAKE_NVML_BROKEN must name the fake NVML libraries"
#endif

#define P4D "hwloc-aws-p4d.24xl-nixl.xml"

static mt_topo *probe(const char *lib, const char *machine, mt_status want) {
    setenv("MT_NVML_LIBRARY", lib, 1);
    setenv("FAKE_NVML_MACHINE", machine, 1);
    mt_topo *t = load_fixture(P4D);
    if (!t) return NULL;
    CHECK_MSG(t->nvlink_note && strstr(t->nvlink_note, "no NVLinkBandwidth matrix"),
              "%s before probing: note '%s'", P4D, t->nvlink_note ? t->nvlink_note : "(null)");
    mt_status s = mt_topo_nvml_probe(t);
    CHECK_MSG(s == want, "%s on fake '%s': probe gives %s (%s), expected %s", lib, machine,
              mt_status_str(s), mt_last_error(), mt_status_str(want));
    return t;
}

static void expect_pair(const mt_topo *t, size_t a, size_t b, const char *want, const char *what) {
    char got[16];
    mt_topo_conn_str(mt_topo_gpu_gpu(t, a, b), got, sizeof(got));
    CHECK_MSG(strcmp(got, want) == 0, "%s: GPU%d-GPU%d is %s, expected %s", what,
              t->gpus[a].index, t->gpus[b].index, got, want);
}

static void expect_islands(const mt_topo *t, const int *want, size_t n_want, const char *what) {
    int got[16];
    size_t n = 99;
    CHECK_OK(mt_topo_nvlink_islands(t, got, &n));
    CHECK_MSG(n == n_want, "%s: %zu NVLink islands, expected %zu", what, n, n_want);
    for (size_t i = 0; i < t->n_gpus && n == n_want; i++)
        CHECK_MSG(got[i] == want[i], "%s: GPU%zu in island %d, expected %d", what, i, got[i],
                  want[i]);
}

/* Every GPU: 6 switch entries of 2 links; every pair NV12; one island; no note left. */
static void check_p4d_switched(mt_topo *t, const char *what) {
    CHECK_MSG(t->nvlink_note == NULL, "%s: note '%s' after a full probe", what,
              t->nvlink_note ? t->nvlink_note : "");
    for (size_t i = 0; i < t->n_gpus; i++) {
        const mt_topo_gpu *g = &t->gpus[i];
        CHECK_MSG(g->nvlink_known, "%s: GPU%zu NVLink unknown", what, i);
        CHECK_MSG(g->n_links == 6, "%s: GPU%zu has %zu link entries, expected 6 switches", what, i,
                  g->n_links);
        for (size_t l = 0; l < g->n_links; l++) {
            char want[16];
            snprintf(want, sizeof(want), "0000:c%zu:00.0", l);
            CHECK_MSG(g->links[l].kind == MT_TOPO_LINK_SWITCH && g->links[l].count == 2 &&
                          strcmp(g->links[l].target, want) == 0,
                      "%s: GPU%zu link entry %zu is %s x%d kind %d, expected %s x2 switch", what,
                      i, l, g->links[l].target, g->links[l].count, (int)g->links[l].kind, want);
        }
        CHECK_MSG(mt_topo_gpu_nvlinks(t, i) == 12, "%s: GPU%zu has %d NVLinks", what, i,
                  mt_topo_gpu_nvlinks(t, i));
        for (size_t j = 0; j < t->n_gpus; j++) expect_pair(t, i, j, i == j ? "X" : "NV12", what);
    }
    const int one[8] = {0};
    expect_islands(t, one, 1, what);
}

static void test_p4d_nvswitch(void) {
    mt_topo *t = probe(FAKE_NVML, "p4d", MT_OK);
    if (!t) return;
    CHECK(t->n_gpus == 8);
    check_p4d_switched(t, "p4d fake");
    int groups[8];
    size_t n = 0;
    CHECK_OK(mt_topo_tp_groups(t, 4, groups, &n));
    CHECK_MSG(n == 2 && groups[0] == 0 && groups[3] == 3 && groups[4] == 4,
              "p4d fake: tp=4 gives %zu groups starting %d", n, groups[0]);
    mt_topo_destroy(t);
}

/* Links already in the model (as from hwloc's matrix) are replaced, not added to. */
static void test_replaces_links(void) {
    setenv("MT_NVML_LIBRARY", FAKE_NVML, 1);
    setenv("FAKE_NVML_MACHINE", "p4d", 1);
    mt_topo *t = load_fixture(P4D);
    if (!t) return;
    for (size_t i = 0; i < t->n_gpus; i++)
        CHECK_OK(mt_topo_gpu_add_link(t, &t->gpus[i], "0000:ee:00.0", MT_TOPO_LINK_SWITCH, 3));
    CHECK_OK(mt_topo_nvml_probe(t));
    check_p4d_switched(t, "p4d fake over old links");
    mt_topo_destroy(t);
}

static void check_pairs(const char *lib, const char *what) {
    mt_topo *t = probe(lib, "pairs", MT_OK);
    if (!t) return;
    for (size_t i = 0; i < t->n_gpus; i++) {
        const mt_topo_gpu *g = &t->gpus[i];
        const mt_topo_gpu *peer = &t->gpus[i ^ 1];
        CHECK_MSG(g->nvlink_known && g->n_links == 1 && g->links[0].kind == MT_TOPO_LINK_GPU &&
                      g->links[0].count == 4 && strcmp(g->links[0].target, peer->bus_id) == 0,
                  "%s: GPU%zu should have 4 links to %s only (%zu entries)", what, i,
                  peer->bus_id, g->n_links);
    }
    expect_pair(t, 0, 1, "NV4", what);
    expect_pair(t, 6, 7, "NV4", what);
    expect_pair(t, 1, 2, "NODE", what); /* 10:1d and 20:1c: host bridges of one NUMA node */
    expect_pair(t, 0, 4, "SYS", what);
    const int isl[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    expect_islands(t, isl, 4, what);
    mt_topo_destroy(t);
}

static void test_pairs(void) {
    check_pairs(FAKE_NVML, "pairs fake");
    /* Without nvmlDeviceGetNvLinkRemoteDeviceType the peer is recognised by its bus id. */
    check_pairs(FAKE_NVML_OLD, "pairs fake, NVML without remote device type");
}

/* A failed NVML leaves every GPU unknown, the PCIe codes in place, and a note saying why. */
static void check_unknown(mt_topo *t, const char *want_in_note, const char *what) {
    if (!t) return;
    for (size_t i = 0; i < t->n_gpus; i++)
        CHECK_MSG(!t->gpus[i].nvlink_known && t->gpus[i].n_links == 0,
                  "%s: GPU%zu has NVLink data", what, i);
    expect_pair(t, 0, 1, "PHB", what);
    CHECK_MSG(t->nvlink_note && strncmp(t->nvlink_note, "NVLink unknown", 14) == 0 &&
                  strstr(t->nvlink_note, want_in_note),
              "%s: note '%s' should say NVLink unknown and '%s'", what,
              t->nvlink_note ? t->nvlink_note : "(null)", want_in_note);
    mt_topo_destroy(t);
}

static void test_failures(void) {
    check_unknown(probe(FAKE_NVML, "initfail", MT_ERR_SYSTEM), "Driver Not Loaded",
                  "nvmlInit failing");
    check_unknown(probe("/nonexistent/libnvidia-ml.so.1", "p4d", MT_ERR_NOT_FOUND),
                  "/nonexistent/libnvidia-ml.so.1 not found", "missing library");
    check_unknown(probe(FAKE_NVML_BROKEN, "p4d", MT_ERR_UNSUPPORTED),
                  "nvmlDeviceGetNvLinkRemotePciInfo_v2", "library missing a symbol");
}

/* One GPU NVML does not know, one whose links cannot be read: those stay unknown, named. */
static void test_partial(void) {
    const char *machines[2] = {"partial", "linkerr"};
    const char *bad[2] = {"0000:a0:1d.0", "0000:20:1d.0"};
    for (int m = 0; m < 2; m++) {
        mt_topo *t = probe(FAKE_NVML, machines[m], MT_OK);
        if (!t) continue;
        for (size_t i = 0; i < t->n_gpus; i++) {
            int is_bad = strcmp(t->gpus[i].bus_id, bad[m]) == 0;
            CHECK_MSG(t->gpus[i].nvlink_known == !is_bad, "%s: GPU %s known=%d", machines[m],
                      t->gpus[i].bus_id, t->gpus[i].nvlink_known);
        }
        CHECK_MSG(t->nvlink_note && strstr(t->nvlink_note, bad[m]), "%s: note '%s'", machines[m],
                  t->nvlink_note ? t->nvlink_note : "(null)");
        mt_topo_destroy(t);
    }
}

static void test_list_gpus(void) {
    setenv("MT_NVML_LIBRARY", FAKE_NVML, 1);
    setenv("FAKE_NVML_MACHINE", "partial", 1);
    mt_nvml *n = NULL;
    char why[256];
    CHECK_OK(mt_nvml_open(&n, why, sizeof(why)));
    if (!n) return;
    mt_nvml_gpu *g = NULL;
    size_t count = 0;
    CHECK_OK(mt_nvml_list_gpus(n, &g, &count));
    CHECK_MSG(count == 7, "partial fake lists %zu GPUs", count);
    if (g && count == 7) {
        CHECK_MSG(strcmp(g[0].bus_id, "0000:10:1c.0") == 0, "first GPU %s", g[0].bus_id);
        CHECK_MSG(strcmp(g[6].bus_id, "0000:a0:1c.0") == 0, "last GPU %s", g[6].bus_id);
        CHECK_MSG(strncmp(g[2].uuid, "GPU-a1000002-", 13) == 0, "uuid %s", g[2].uuid);
    }
    free(g);
    mt_nvml_close(n);
}

/* This machine: without a GPU, discovery never loads NVML (the fake would leave its mark) and
 * prints nothing at warn level. With a GPU the check only reports what it found. */
static void test_live_quiet(void) {
    char mark[64], errlog[64];
    snprintf(mark, sizeof(mark), "/tmp/mt_nvml_mark_%d", (int)getpid());
    snprintf(errlog, sizeof(errlog), "/tmp/mt_nvml_err_%d", (int)getpid());
    unlink(mark);
    setenv("MT_NVML_LIBRARY", FAKE_NVML, 1);
    setenv("FAKE_NVML_MACHINE", "p4d", 1);
    setenv("FAKE_NVML_MARK", mark, 1);
    setenv("MT_LOG_LEVEL", "warn", 1);
    fflush(stderr);
    int saved = dup(2), fd = open(errlog, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    if (fd >= 0) dup2(fd, 2);
    mt_topo *t = NULL;
    mt_status s = mt_topo_discover(&t);
    fflush(stderr);
    if (saved >= 0) dup2(saved, 2), close(saved);
    if (fd >= 0) close(fd);
    CHECK_MSG(s == MT_OK, "discover: %s", mt_last_error());
    FILE *f = fopen(errlog, "r");
    char line[512] = "";
    int lines = 0;
    while (f && fgets(line, sizeof(line), f)) lines++, fputs(line, stderr);
    if (f) fclose(f);
    unlink(errlog);
    if (t && t->n_gpus == 0) {
        CHECK_MSG(access(mark, F_OK) != 0, "NVML was loaded on a machine without GPUs");
        CHECK_MSG(t->nvlink_note == NULL, "note '%s' without GPUs", t->nvlink_note);
        CHECK_MSG(lines == 0, "live discovery printed %d line(s) at warn level", lines);
    } else if (t) {
        printf("live: %zu GPU(s); NVLink note: %s\n", t->n_gpus,
               t->nvlink_note ? t->nvlink_note : "(none)");
    }
    unlink(mark);
    unsetenv("FAKE_NVML_MARK");
    mt_topo_destroy(t);
}

int main(void) {
    setenv("MT_LOG_LEVEL", "warn", 1); /* the quiet checks count warn-level lines */
    test_p4d_nvswitch();
    test_replaces_links();
    test_pairs();
    test_failures();
    test_partial();
    test_list_gpus();
    test_live_quiet();
    return check_report("test_topo_nvml");
}
