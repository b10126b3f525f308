/* Local rank -> GPU placement (mesh/mesh_placement.c) on real topologies and a hand-made one:
 * expected mappings are checked in (tests/fixtures/placement/expected.txt); MT_DEVICE_MAP and
 * the fallbacks are checked here.
 *   test_mesh_placement [--update]   --update rewrites expected.txt from the current code */
#include "check.h"
#include "topo_fixture.h"

#include "mesh/mesh_placement.h"

#include <meshtrain/status.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLACEMENT_DIR MT_TOPO_FIXTURES "/../placement"

static void mapping_line(const char *label, const mt_topo *t, int tp, char *buf, size_t size) {
    int n = (int)t->n_gpus, gpu[64];
    char why[256];
    size_t len = (size_t)snprintf(buf, size, "%s gpus=%d tp=%d:", label, n, tp);
    if (mt_placement_compute(t, n, tp, NULL, gpu, why, sizeof why) != MT_OK) {
        snprintf(buf + len, size - len, " error %s", mt_last_error());
        return;
    }
    for (int l = 0; l < n && len < size; l++)
        len += (size_t)snprintf(buf + len, size - len, " %d", gpu[l]);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every fixture with GPUs, in name order: "<dir>/<name>". */
static int list_fixtures(char **paths, int max) {
    const char *dirs[] = {MT_TOPO_FIXTURES, PLACEMENT_DIR};
    int n = 0;
    for (int d = 0; d < 2; d++) {
        DIR *dir = opendir(dirs[d]);
        if (!dir) continue;
        for (struct dirent *e; (e = readdir(dir)) && n < max;) {
            size_t len = strlen(e->d_name);
            if (len < 5 || strcmp(e->d_name + len - 4, ".xml") != 0) continue;
            size_t sz = strlen(dirs[d]) + len + 2;
            paths[n] = malloc(sz);
            snprintf(paths[n], sz, "%s/%s", dirs[d], e->d_name);
            n++;
        }
        closedir(dir);
    }
    qsort(paths, (size_t)n, sizeof *paths, cmp_str);
    return n;
}

static void check_expected(int update) {
    char *paths[64];
    int n = list_fixtures(paths, 64);
    CHECK_MSG(n >= 16, "found %d fixtures", n);
    char expected_path[512];
    snprintf(expected_path, sizeof expected_path, "%s/expected.txt", PLACEMENT_DIR);
    FILE *out = update ? fopen(expected_path, "w") : NULL;
    FILE *in = update ? NULL : fopen(expected_path, "r");
    CHECK_MSG(update ? out != NULL : in != NULL, "cannot open %s", expected_path);
    if (out)
        fprintf(out, "# local rank -> GPU for local world = GPU count; written by "
                     "test_mesh_placement --update\n");
    char want[1024];
    if (in && !fgets(want, sizeof want, in)) want[0] = '\0'; /* the comment line */
    for (int i = 0; i < n; i++) {
        mt_topo *t = NULL;
        CHECK_MSG(mt_topo_load_file(paths[i], &t) == MT_OK, "%s: %s", paths[i], mt_last_error());
        if (t && t->n_gpus > 0) {
            const char *label = strrchr(paths[i], '/') + 1;
            for (int tp = 1; tp <= 8; tp *= 2) {
                char got[1024];
                mapping_line(label, t, tp, got, sizeof got);
                if (out) {
                    fprintf(out, "%s\n", got);
                } else if (in) {
                    if (!fgets(want, sizeof want, in)) want[0] = '\0';
                    want[strcspn(want, "\n")] = '\0';
                    CHECK_MSG(strcmp(got, want) == 0, "placement changed:\n  got  %s\n  want %s",
                              got, want);
                }
            }
        }
        mt_topo_destroy(t);
        free(paths[i]);
    }
    if (in) {
        CHECK_MSG(!fgets(want, sizeof want, in), "expected.txt has more lines than fixtures: %s",
                  want);
        fclose(in);
    }
    if (out) fclose(out);
}

/* The hand-made host: NVLink pairs {0,2} and {1,3} must become the tp=2 groups. */
static void check_crossed_pairs(void) {
    mt_topo *t = NULL;
    CHECK_OK(mt_topo_load_file(PLACEMENT_DIR "/nvlink-crossed-pairs-4gpu.xml", &t));
    if (!t) return;
    int gpu[8];
    char why[256];
    CHECK_OK(mt_placement_compute(t, 4, 2, NULL, gpu, why, sizeof why));
    CHECK_MSG(gpu[0] == 0 && gpu[1] == 2 && gpu[2] == 1 && gpu[3] == 3,
              "crossed pairs: %d %d %d %d", gpu[0], gpu[1], gpu[2], gpu[3]);
    /* Two ranks with tp=2 on this host: the first NVLink pair. */
    CHECK_OK(mt_placement_compute(t, 2, 2, NULL, gpu, why, sizeof why));
    CHECK_MSG(gpu[0] == 0 && gpu[1] == 2, "2 ranks: %d %d", gpu[0], gpu[1]);
    /* tp=1: in order. */
    CHECK_OK(mt_placement_compute(t, 4, 1, NULL, gpu, why, sizeof why));
    CHECK(gpu[0] == 0 && gpu[1] == 1 && gpu[2] == 2 && gpu[3] == 3);
    /* MT_DEVICE_MAP wins. */
    CHECK_OK(mt_placement_compute(t, 4, 2, "3,2,1,0", gpu, why, sizeof why));
    CHECK(gpu[0] == 3 && gpu[1] == 2 && gpu[2] == 1 && gpu[3] == 0);
    CHECK(strstr(why, "MT_DEVICE_MAP") != NULL);
    /* Bad maps name the value. */
    CHECK(mt_placement_compute(t, 4, 2, "0,1,2", gpu, why, sizeof why) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "3 entries for 4 local ranks") != NULL);
    CHECK(mt_placement_compute(t, 4, 2, "0,1,2,4", gpu, why, sizeof why) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "entry 3") != NULL);
    CHECK(mt_placement_compute(t, 4, 2, "0,x,2,3", gpu, why, sizeof why) == MT_ERR_INVALID_ARG);
    CHECK(mt_placement_compute(t, 4, 2, "0,1,,3", gpu, why, sizeof why) == MT_ERR_INVALID_ARG);
    /* More ranks than GPUs: round-robin, said so. */
    CHECK_OK(mt_placement_compute(t, 6, 2, NULL, gpu, why, sizeof why));
    CHECK(gpu[4] == 0 && gpu[5] == 1 && strstr(why, "round-robin") != NULL);
    mt_topo_destroy(t);
}

static void check_no_gpu(void) {
    mt_topo *t = NULL;
    CHECK_OK(mt_topo_create("synthetic", &t));
    if (!t) return;
    int gpu[4] = {7, 7, 7, 7};
    char why[256];
    CHECK_OK(mt_placement_compute(t, 4, 2, NULL, gpu, why, sizeof why));
    CHECK(gpu[0] == -1 && gpu[3] == -1);
    mt_topo_destroy(t);
}

int main(int argc, char **argv) {
    int update = argc > 1 && strcmp(argv[1], "--update") == 0;
    check_expected(update);
    if (!update) {
        check_crossed_pairs();
        check_no_gpu();
    }
    return check_report("test_mesh_placement");
}
