/* NVLinks from hwloc's NVLinkBandwidth matrix (topo/nvlink_rate.c): the per-link rate table, the
 * two real files that carry a matrix (IBM POWER8 Minsky, NVIDIA DGX-2), and built matrices for
 * rounding, unknown models, absurd values and GPUs missing from the matrix. */
#include "check.h"
#include "topo_fixture.h"
#include "topo/classify.h"
#include "topo/nvlink_rate.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void rate_case(const char *name, uint64_t want, int want_gen) {
    int gen = -1;
    uint64_t got = mt_topo_nvlink_rate(name, &gen);
    CHECK_MSG(got == want && gen == want_gen, "rate of '%s' is %llu (NVLink %d), expected %llu "
              "(NVLink %d)", name ? name : "(null)", (unsigned long long)got, gen,
              (unsigned long long)want, want_gen);
}

static void test_rates(void) {
    rate_case("Tesla P100-SXM2-16GB", 20000, 1);
    rate_case("Quadro GP100", 20000, 1);
    rate_case("Tesla V100-SXM3-32GB-H", 25000, 2);
    rate_case("GV100GL [Tesla V100 SXM2 32GB]", 25000, 2);
    rate_case("NVIDIA A100-SXM4-40GB", 25000, 3);
    rate_case("GA100 [A100 SXM4 40GB]", 25000, 3);
    rate_case("NVIDIA RTX A6000", 25000, 3);
    rate_case("NVIDIA H100 80GB HBM3", 25000, 4);
    rate_case("NVIDIA H100 NVL", 25000, 4);
    rate_case("NVIDIA H200", 25000, 4);
    rate_case("NVIDIA GH200 480GB", 25000, 4);
    rate_case("NVIDIA B200", 50000, 5);
    rate_case("NVIDIA GB200", 50000, 5);
    rate_case("NVIDIA B300 SXM6 AC", 50000, 5);
    rate_case("NVIDIA A10G", 0, 0);
    rate_case("NVIDIA L4", 0, 0);
    rate_case("NVIDIA XA100", 0, 0); /* whole words only */
    rate_case("H1000", 0, 0);
    rate_case("", 0, 0);
    rate_case(NULL, 0, 0);
}

static void expect_code(const mt_topo *t, size_t a, size_t b, const char *want) {
    char got[16];
    mt_topo_conn_str(mt_topo_gpu_gpu(t, a, b), got, sizeof(got));
    CHECK_MSG(strcmp(got, want) == 0, "%s: GPU%zu (%s) - GPU%zu (%s) is %s, expected %s",
              t->source, a, t->gpus[a].bus_id, b, t->gpus[b].bus_id, got, want);
}

/* IBM S822LC "Minsky": GPUs 0002:01 and 0003:01 on package 0, 000a:01 and 000b:01 on package 1;
 * the matrix row of each GPU holds 40000 MB/s (2 NVLink 1.0 links) to its partner and 40000 to
 * its CPU package. */
static void test_minsky(void) {
    mt_topo *t = load_fixture("hwloc-ibm-power8-minsky-4xP100-nvlink.v2.xml");
    if (!t) return;
    CHECK_MSG(t->nvlink_note == NULL, "Minsky: note '%s'", t->nvlink_note);
    const char *pkg_of[4] = {NULL, NULL, NULL, NULL};
    for (size_t i = 0; i < t->n_gpus; i++) {
        const mt_topo_gpu *g = &t->gpus[i];
        const char *partner = t->gpus[i ^ 1].bus_id;
        int gpu_links = -1, cpu_links = -1;
        for (size_t l = 0; l < g->n_links; l++) {
            if (g->links[l].kind == MT_TOPO_LINK_GPU && strcmp(g->links[l].target, partner) == 0)
                gpu_links = g->links[l].count;
            if (g->links[l].kind == MT_TOPO_LINK_OTHER) {
                cpu_links = g->links[l].count;
                pkg_of[i] = g->links[l].target;
            }
        }
        CHECK_MSG(g->nvlink_known && g->n_links == 2 && gpu_links == 2 && cpu_links == 2,
                  "Minsky GPU%zu (%s): %zu entries, %d links to %s, %d to its CPU", i, g->bus_id,
                  g->n_links, gpu_links, partner, cpu_links);
        CHECK_MSG(mt_topo_gpu_nvlinks(t, i) == 2, "Minsky GPU%zu: %d NVLinks to GPUs", i,
                  mt_topo_gpu_nvlinks(t, i));
    }
    if (pkg_of[0] && pkg_of[1] && pkg_of[2] && pkg_of[3]) {
        CHECK_MSG(strcmp(pkg_of[0], pkg_of[1]) == 0 && strcmp(pkg_of[2], pkg_of[3]) == 0 &&
                      strcmp(pkg_of[0], pkg_of[2]) != 0 && strncmp(pkg_of[0], "package:", 8) == 0,
                  "Minsky CPU link targets %s %s %s %s", pkg_of[0], pkg_of[1], pkg_of[2],
                  pkg_of[3]);
    }
    expect_code(t, 0, 1, "NV2");
    expect_code(t, 2, 3, "NV2");
    expect_code(t, 0, 2, "SYS");
    expect_code(t, 1, 3, "SYS");
    int isl[4];
    size_t n = 0;
    CHECK_OK(mt_topo_nvlink_islands(t, isl, &n));
    CHECK_MSG(n == 2 && isl[0] == 0 && isl[1] == 0 && isl[2] == 1 && isl[3] == 1,
              "Minsky islands: %zu (%d %d %d %d)", n, isl[0], isl[1], isl[2], isl[3]);
    mt_topo_destroy(t);
}

/* DGX-2: 16 V100 and 12 NVSwitches; each GPU row has 25000 MB/s (one NVLink 2.0 link) to each
 * of six switches of its baseboard. NVML reports only the links of GPUs, so the matrix has no
 * switch-to-switch entry although the two baseboards' switches are trunked: every GPU pair is
 * NV6 and the 16 GPUs are one island (see topo/classify.c). */
static void test_dgx2(void) {
    mt_topo *t = load_fixture("hwloc-nvidia-dgx2-v100-nvswitch.v2.xml");
    if (!t) return;
    CHECK_MSG(t->nvlink_note == NULL, "DGX-2: note '%s'", t->nvlink_note);
    for (size_t i = 0; i < t->n_gpus; i++) {
        const mt_topo_gpu *g = &t->gpus[i];
        int ok = g->nvlink_known && g->n_links == 6;
        for (size_t l = 0; ok && l < g->n_links; l++)
            ok = g->links[l].kind == MT_TOPO_LINK_SWITCH && g->links[l].count == 1;
        CHECK_MSG(ok, "DGX-2 GPU%zu (%s): %zu entries, expected 6 switches of 1 link", i,
                  g->bus_id, g->n_links);
        CHECK_MSG(mt_topo_gpu_nvlinks(t, i) == 6, "DGX-2 GPU%zu: %d NVLinks", i,
                  mt_topo_gpu_nvlinks(t, i));
        for (size_t j = 0; j < t->n_gpus; j++) expect_code(t, i, j, i == j ? "X" : "NV6");
    }
    /* The two baseboards use disjoint switches, and no switch row links to another switch. */
    if (t->n_gpus == 16 && t->gpus[0].n_links == 6 && t->gpus[15].n_links == 6)
        for (size_t a = 0; a < 6; a++)
            for (size_t b = 0; b < 6; b++)
                CHECK(strcmp(t->gpus[0].links[a].target, t->gpus[15].links[b].target) != 0);
    size_t n = t->nvlink_bw_n, sw_sw = 0;
    for (size_t i = 16; i < n; i++)
        for (size_t j = 16; j < n; j++) sw_sw += i != j && t->nvlink_bw[i * n + j] != 0;
    CHECK_MSG(sw_sw == 0, "DGX-2 matrix: %zu switch-to-switch entries", sw_sw);
    int isl[16];
    size_t ni = 0;
    CHECK_OK(mt_topo_nvlink_islands(t, isl, &ni));
    CHECK_MSG(ni == 1, "DGX-2: %zu NVLink islands, expected 1", ni);
    mt_topo_destroy(t);
}

/* A file without a matrix: GPUs unknown, and the note says the file has none. */
static void test_no_matrix(void) {
    mt_topo *t = load_fixture("hwloc-aws-p5.48xl-nixl.xml");
    if (!t) return;
    for (size_t i = 0; i < t->n_gpus; i++) CHECK(!t->gpus[i].nvlink_known);
    CHECK_MSG(t->nvlink_note && strstr(t->nvlink_note, "NVLink unknown") &&
                  strstr(t->nvlink_note, "no NVLinkBandwidth matrix"),
              "p5: note '%s'", t->nvlink_note ? t->nvlink_note : "(null)");
    mt_topo_destroy(t);
}

/* ---- built matrices ------------------------------------------------------------------------ */

/* Runs the conversion with stderr captured; returns the number of lines containing needle. */
static int convert_counting(mt_topo *t, const char *needle) {
    char path[64];
    snprintf(path, sizeof(path), "/tmp/mt_nvlink_err_%d", (int)getpid());
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    if (fd >= 0) dup2(fd, 2);
    CHECK_OK(mt_topo_links_from_nvlink_bw(t));
    fflush(stderr);
    if (saved >= 0) dup2(saved, 2), close(saved);
    if (fd >= 0) close(fd);
    FILE *f = fopen(path, "r");
    char line[1024];
    int hits = 0;
    while (f && fgets(line, sizeof(line), f)) {
        fputs(line, stderr);
        hits += strstr(line, needle) != NULL;
    }
    if (f) fclose(f);
    unlink(path);
    return hits;
}

/* Three GPUs of the given models, one switch, and an n x n matrix over labels. */
static mt_topo *built(const char *const *models, const char *const *labels, size_t n,
                      const uint64_t *values) {
    static const char *const bus[3] = {"0000:01:00.0", "0000:02:00.0", "0000:03:00.0"};
    mt_topo *t = NULL;
    CHECK_OK(mt_topo_create("built", &t));
    if (!t) return NULL;
    for (int i = 0; i < 3; i++)
        CHECK_OK(mt_topo_add_gpu(t, i, bus[i], models[i], -1, "", -1, NULL));
    CHECK_OK(mt_topo_add_switch(t, "0000:f0:00.0", -1));
    CHECK_OK(mt_topo_finish(t));
    t->nvlink_bw = calloc(n * n, sizeof(*t->nvlink_bw));
    t->nvlink_bw_labels = calloc(n, sizeof(*t->nvlink_bw_labels));
    if (!t->nvlink_bw || !t->nvlink_bw_labels) return t;
    memcpy(t->nvlink_bw, values, n * n * sizeof(*values));
    for (size_t i = 0; i < n; i++) t->nvlink_bw_labels[i] = strdup(labels[i]);
    t->nvlink_bw_n = n;
    return t;
}

static int links_to(const mt_topo_gpu *g, const char *target, mt_topo_link_kind kind) {
    for (size_t l = 0; l < g->n_links; l++)
        if (strcmp(g->links[l].target, target) == 0 && g->links[l].kind == kind)
            return g->links[l].count;
    return -1;
}

static const char *const labels4[4] = {"0000:01:00.0", "0000:02:00.0", "0000:03:00.0",
                                       "0000:F0:00.0"};

static void test_rounding(void) {
    const char *h100[3] = {"NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3",
                           "NVIDIA H100 80GB HBM3"};
    /* 0-1: 3 links; 0-switch: 2; 1-2: 2.4 links (-> 2); 2-switch: 0.2 (-> at least 1);
     * diagonal 1000000 as hwloc writes it */
    const uint64_t v[16] = {1000000, 75000,   0,       50000,  75000, 1000000, 60000, 0,
                            0,       60000,   1000000, 5000,   50000, 0,       5000,  1000000};
    mt_topo *t = built(h100, labels4, 4, v);
    if (!t) return;
    int warnings = convert_counting(t, "rounded");
    CHECK_MSG(warnings == 1, "rounding: %d warning lines, expected exactly one", warnings);
    CHECK(links_to(&t->gpus[0], "0000:02:00.0", MT_TOPO_LINK_GPU) == 3);
    CHECK(links_to(&t->gpus[0], "0000:f0:00.0", MT_TOPO_LINK_SWITCH) == 2);
    CHECK(links_to(&t->gpus[1], "0000:03:00.0", MT_TOPO_LINK_GPU) == 2);
    CHECK(links_to(&t->gpus[2], "0000:f0:00.0", MT_TOPO_LINK_SWITCH) == 1);
    for (size_t i = 0; i < 3; i++) CHECK_MSG(t->gpus[i].nvlink_known, "rounding: GPU%zu", i);
    expect_code(t, 0, 1, "NV3");
    expect_code(t, 1, 2, "NV2");
    expect_code(t, 0, 2, "NV1"); /* both reach the switch: the smaller total, 1 */
    CHECK(t->nvlink_note == NULL);
    mt_topo_destroy(t);
}

static void test_unknown_model(void) {
    const char *models[3] = {"Mystery GPU X", "Mystery GPU X", "NVIDIA A100-SXM4-80GB"};
    const uint64_t v[16] = {0, 50000, 0, 0, 50000, 0, 0, 0, 0, 0, 0, 75000, 0, 0, 75000, 0};
    mt_topo *t = built(models, labels4, 4, v);
    if (!t) return;
    int warnings = convert_counting(t, "Mystery GPU X");
    CHECK_MSG(warnings == 1, "unknown model: %d warning lines naming it, expected one",
              warnings);
    CHECK(!t->gpus[0].nvlink_known && !t->gpus[1].nvlink_known);
    CHECK(t->gpus[0].n_links == 0 && t->gpus[1].n_links == 0);
    CHECK(t->gpus[2].nvlink_known && links_to(&t->gpus[2], "0000:f0:00.0",
                                              MT_TOPO_LINK_SWITCH) == 3);
    CHECK_MSG(t->nvlink_note && strstr(t->nvlink_note, "Mystery GPU X"), "note '%s'",
              t->nvlink_note ? t->nvlink_note : "(null)");
    CHECK_MSG(mt_topo_gpu_gpu(t, 0, 1).code != MT_TOPO_NV, "unknown model: GPU0-GPU1 is NVLink");
    mt_topo_destroy(t);
}

static void test_absurd_and_missing(void) {
    const char *a100[3] = {"NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB",
                           "NVIDIA A100-SXM4-80GB"};
    /* GPU 0 lists an absurd value; GPU 1's row is empty (no active link); GPU 2 is absent. */
    const char *const labels3[3] = {"0000:01:00.0", "0000:02:00.0", "0000:F0:00.0"};
    const uint64_t v[9] = {0, 0, 25000ull * 1000, 0, 0, 0, 25000ull * 1000, 0, 0};
    mt_topo *t = built(a100, labels3, 3, v);
    if (!t) return;
    int warnings = convert_counting(t, "0000:01:00.0");
    CHECK_MSG(warnings == 1, "absurd value: %d warnings, expected one", warnings);
    CHECK(!t->gpus[0].nvlink_known && t->gpus[0].n_links == 0);
    CHECK(t->gpus[1].nvlink_known && t->gpus[1].n_links == 0);
    CHECK(!t->gpus[2].nvlink_known);
    CHECK_MSG(t->nvlink_note && strstr(t->nvlink_note, "absurd"), "note '%s'",
              t->nvlink_note ? t->nvlink_note : "(null)");
    mt_topo_destroy(t);
}

int main(void) {
    test_rates();
    test_minsky();
    test_dgx2();
    test_no_matrix();
    test_rounding();
    test_unknown_model();
    test_absurd_and_missing();
    return check_report("test_topo_nvlink");
}
