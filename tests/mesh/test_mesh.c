/* DeviceMesh under mtrun: shape and names from the command line; checks coordinates, every
 * dimension's group (size, rank, members) and a collective on it against values computed here
 * from the row-major layout, sub-meshes, flattening, and error cases.
 *
 *   test_mesh --shape 2x2 --names dp,tp [--flatten NAME] [--expect-error TEXT]
 *             [--last-rank-shape 4x1]
 * --flatten NAME: flattens the first two dimensions into NAME and checks that group too.
 * --expect-error TEXT: mt_mesh_create must fail on every rank with a message containing TEXT.
 * --last-rank-shape S: the last rank passes shape S instead (ranks that disagree).
 * --expect-gpus 0,2,1,3: the GPU the placement must give each local rank (with MT_TOPO_FILE).
 * --flatten-disagree: before --flatten NAME, the last rank flattens a dimension that does not
 *   exist: every rank must fail at once saying the ranks disagree, and the next flatten works.
 */
#include "check.h"

#include <meshtrain/meshtrain.h>
#include <meshtrain/mesh.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int parse_shape(const char *s, int *shape) {
    int n = 0;
    while (*s && n < MT_MESH_MAX_DIMS) {
        char *end;
        shape[n++] = (int)strtol(s, &end, 10);
        s = *end == 'x' ? end + 1 : end;
        if (*end && *end != 'x') break;
    }
    return n;
}

static int parse_names(char *s, const char **names) {
    int n = 0;
    for (char *tok = strtok(s, ","); tok && n < MT_MESH_MAX_DIMS; tok = strtok(NULL, ","))
        names[n++] = strcmp(tok, "EMPTY") == 0 ? "" : tok;
    return n;
}

/* The members of the group along the given dimensions, row-major, computed without the mesh. */
static int expected_members(int rank, int ndim, const int *shape, unsigned mask, int *out) {
    int coords[MT_MESH_MAX_DIMS], rest = rank;
    for (int d = ndim - 1; d >= 0; d--) {
        coords[d] = rest % shape[d];
        rest /= shape[d];
    }
    int n = 1;
    for (int d = 0; d < ndim; d++)
        if (mask >> d & 1u) n *= shape[d];
    for (int i = 0; i < n; i++) {
        int c[MT_MESH_MAX_DIMS];
        memcpy(c, coords, sizeof c);
        int k = i;
        for (int d = ndim - 1; d >= 0; d--)
            if (mask >> d & 1u) {
                c[d] = k % shape[d];
                k /= shape[d];
            }
        int r = 0;
        for (int d = 0; d < ndim; d++) r = r * shape[d] + c[d];
        out[i] = r;
    }
    return n;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void check_group(mt_group *g, const char *label, int rank, const int *members, int n) {
    CHECK_MSG(mt_group_size(g) == n, "%s: size %d, expected %d", label, mt_group_size(g), n);
    int me = -1;
    for (int i = 0; i < n; i++) {
        CHECK_MSG(mt_group_global_rank(g, i) == members[i], "%s: member %d is rank %d, expected %d",
                  label, i, mt_group_global_rank(g, i), members[i]);
        if (members[i] == rank) me = i;
    }
    CHECK_MSG(mt_group_rank(g) == me, "%s: group rank %d, expected %d", label, mt_group_rank(g), me);
    /* A collective on the group: the sum of the members' global ranks, and their list. */
    float mine = (float)rank, sum = 0;
    CHECK_OK(mt_all_reduce(g, &mine, &sum, 1, MT_F32, MT_REDUCE_SUM, NULL));
    float want = 0;
    for (int i = 0; i < n; i++) want += (float)members[i];
    CHECK_MSG(sum == want, "%s: all_reduce gave %g, expected %g", label, sum, want);
    float *all = calloc((size_t)n, sizeof *all);
    CHECK_OK(mt_all_gather(g, &mine, all, 1, MT_F32, NULL));
    for (int i = 0; i < n; i++)
        CHECK_MSG(all[i] == (float)members[i], "%s: all_gather[%d] = %g, expected %d", label, i,
                  all[i], members[i]);
    free(all);
}

int main(int argc, char **argv) {
    char names_buf[256] = "dp,tp";
    const char *shape_arg = "2x2", *flatten = NULL, *expect_error = NULL, *last_shape = NULL;
    const char *expect_gpus = NULL;
    bool flatten_disagree = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) shape_arg = argv[++i];
        else if (!strcmp(argv[i], "--names") && i + 1 < argc)
            snprintf(names_buf, sizeof names_buf, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--flatten") && i + 1 < argc) flatten = argv[++i];
        else if (!strcmp(argv[i], "--expect-error") && i + 1 < argc) expect_error = argv[++i];
        else if (!strcmp(argv[i], "--last-rank-shape") && i + 1 < argc) last_shape = argv[++i];
        else if (!strcmp(argv[i], "--expect-gpus") && i + 1 < argc) expect_gpus = argv[++i];
        else if (!strcmp(argv[i], "--flatten-disagree")) flatten_disagree = true;
        else {
            fprintf(stderr, "test_mesh: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    mt_runtime *rt;
    if (mt_init(&rt, &argc, &argv) != MT_OK) {
        fprintf(stderr, "mt_init: %s\n", mt_last_error());
        return 1;
    }
    int rank = mt_runtime_rank(rt), world = mt_runtime_world_size(rt);
    int shape[MT_MESH_MAX_DIMS];
    const char *names[MT_MESH_MAX_DIMS];
    int ndim = parse_shape(last_shape && rank == world - 1 ? last_shape : shape_arg, shape);
    char names_arg[256];
    snprintf(names_arg, sizeof names_arg, "%s", names_buf);
    int nnames = parse_names(names_buf, names);
    if (nnames < ndim) ndim = nnames;

    mt_mesh *mesh = NULL;
    mt_status st = mt_mesh_create(rt, ndim, shape, names, &mesh);
    if (expect_error) {
        CHECK_MSG(st != MT_OK, "mt_mesh_create succeeded; expected an error with '%s'",
                  expect_error);
        if (st != MT_OK) {
            CHECK_MSG(strstr(mt_last_error(), expect_error) != NULL, "error '%s' lacks '%s'",
                      mt_last_error(), expect_error);
            printf("rank %d: expected error: %s\n", rank, mt_last_error());
        }
        mt_mesh_destroy(mesh);
        mt_finalize(rt);
        return check_report("test_mesh") == 0 ? 0 : 1;
    }
    CHECK_MSG(st == MT_OK, "mt_mesh_create: %s", mt_last_error());
    if (st != MT_OK) {
        mt_finalize(rt);
        return 1;
    }
    CHECK(mt_mesh_ndim(mesh) == ndim);
    int coords[MT_MESH_MAX_DIMS], rest = rank;
    for (int d = ndim - 1; d >= 0; d--) {
        coords[d] = rest % shape[d];
        rest /= shape[d];
    }
    for (int d = 0; d < ndim; d++) {
        CHECK(strcmp(mt_mesh_dim_name(mesh, d), names[d]) == 0);
        CHECK(mt_mesh_dim_size(mesh, d) == shape[d]);
        CHECK(mt_mesh_dim_index(mesh, names[d]) == d);
        CHECK_MSG(mt_mesh_coord(mesh, d) == coords[d], "coord %d: %d, expected %d", d,
                  mt_mesh_coord(mesh, d), coords[d]);
        mt_group *g = NULL;
        CHECK_OK(mt_mesh_group(mesh, names[d], &g));
        if (!g) continue;
        int members[4096];
        int n = expected_members(rank, ndim, shape, 1u << d, members);
        check_group(g, names[d], rank, members, n);
        /* A tp group stays on this rank's host unless crossing was allowed. */
        const char *allow = getenv("MT_ALLOW_CROSS_HOST_TP");
        if (strcmp(names[d], "tp") == 0 && !(allow && !strcmp(allow, "1")))
            for (int i = 0; i < n; i++)
                CHECK_MSG(!strcmp(mt_runtime_host_of(rt, members[i]), mt_runtime_host(rt)),
                          "tp member %d is on %s, this rank on %s", members[i],
                          mt_runtime_host_of(rt, members[i]), mt_runtime_host(rt));

        /* The one-dimensional sub-mesh of d shares the group and this rank's coordinate. */
        mt_mesh *sub = NULL;
        CHECK_OK(mt_mesh_submesh(mesh, &names[d], 1, &sub));
        if (sub) {
            mt_group *sg = NULL;
            CHECK(mt_mesh_ndim(sub) == 1 && mt_mesh_coord(sub, 0) == coords[d]);
            CHECK_OK(mt_mesh_group(sub, names[d], &sg));
            CHECK(sg == g);
            int c0 = (coords[d] + 1) % shape[d];
            CHECK(mt_mesh_rank_at(sub, &c0) == members[c0]);
            mt_mesh_destroy(sub);
        }
    }
    CHECK(mt_mesh_rank_at(mesh, coords) == rank);
    if (expect_gpus) {
        int want = -1;
        const char *p = expect_gpus;
        for (int l = 0; l <= mt_runtime_local_rank(rt) && p; l++) {
            want = atoi(p);
            p = strchr(p, ',');
            if (p) p++;
        }
        CHECK_MSG(mt_mesh_gpu(mesh) == want, "local rank %d placed on GPU %d, expected %d",
                  mt_runtime_local_rank(rt), mt_mesh_gpu(mesh), want);
    }
    mt_group *none = NULL;
    CHECK(mt_mesh_group(mesh, "no-such-dim", &none) == MT_ERR_NOT_FOUND && none == NULL);
    CHECK(strstr(mt_last_error(), "no-such-dim") != NULL);

    if (flatten && ndim >= 2 && flatten_disagree) {
        /* The bad rank's arguments are compared before they are checked: failing alone, it
         * would pair the others' call with its next one (and they would wait at that one). */
        const char *bad[2] = {names[0], "no-such-dim"};
        mt_group *fg = (mt_group *)&fg;
        double t0 = now_s();
        mt_status fst = mt_mesh_flatten(mesh, rank == world - 1 ? bad : names, 2, flatten, &fg);
        double secs = now_s() - t0;
        CHECK_MSG(fst != MT_OK && strstr(mt_last_error(), "disagree") != NULL,
                  "flatten with other names on rank %d: %s: %s", world - 1, mt_status_str(fst),
                  mt_last_error());
        CHECK_MSG(fg == NULL, "a failed flatten left its output set");
        CHECK_MSG(secs < 10.0, "the disagreement took %.1f s to show", secs);
        printf("rank %d: expected error after %.2f s: %s\n", rank, secs, mt_last_error());
    }
    if (flatten && ndim >= 2) {
        mt_group *fg = NULL, *again = NULL;
        CHECK_OK(mt_mesh_flatten(mesh, names, 2, flatten, &fg));
        CHECK_OK(mt_mesh_flatten(mesh, names, 2, flatten, &again));
        CHECK(fg && fg == again);
        if (fg) {
            int members[4096];
            int n = expected_members(rank, ndim, shape, 3u, members);
            check_group(fg, flatten, rank, members, n);
        }
        const char *reversed[2] = {names[1], names[0]};
        CHECK(mt_mesh_flatten(mesh, reversed, 2, "bad", NULL) == MT_ERR_INVALID_ARG);
    }
    if (rank == 0) printf("mesh %s (%s) on %d ranks: checked\n", shape_arg, names_arg, world);
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    return check_report("test_mesh") == 0 ? 0 : 1;
}
