/* A user's bug on one rank, as a user's program meets it: a two-module model whose forward
 * all-reduces over the world, and whose forward fails on rank --fail-rank with mt_error_set.
 * On the error the program prints mt_last_error() and, like any program, calls mt_finalize
 * (or, with --abort, mt_abort) and exits 1. Used by module_error.sh, which times how fast the
 * whole job ends.
 *   prog_module_error --fail-rank R [--abort]        (under mtrun or started by hand)
 *   prog_module_error --recover-rank R               rank R raises an error, handles it
 *                                                    (mt_clear_error) and goes on: a normal end
 *   prog_module_error --fail-rank R --before-mesh    rank R fails before mt_mesh_create, where
 *                                                    the others wait for it in the store */
#include <meshtrain/meshtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail_rank = -1, recover_rank = -1;

static mt_status fc_forward(mt_module *m, void *ctx) {
    mt_runtime *rt = ctx;
    int rank = mt_runtime_rank(rt);
    if (rank == fail_rank)
        return mt_error_set(MT_ERR_INVALID_ARG, "token 300 is outside the vocabulary of %d "
                            "(a bug on purpose)", 256);
    /* Every other rank waits here for the failing one, which never joins. */
    float x = (float)rank;
    (void)m;
    return mt_all_reduce(mt_runtime_world(rt), &x, &x, 1, MT_F32, MT_REDUCE_SUM, NULL);
}

int main(int argc, char **argv) {
    bool use_abort = false, before_mesh = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fail-rank") && i + 1 < argc) fail_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--abort")) use_abort = true;
        else if (!strcmp(argv[i], "--before-mesh")) before_mesh = true;
        else if (!strcmp(argv[i], "--recover-rank") && i + 1 < argc) recover_rank = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: prog_module_error --fail-rank R [--abort]\n");
            return 2;
        }
    }
    mt_runtime *rt = NULL;
    mt_status st = mt_init(&rt, &argc, &argv);
    if (st == MT_OK && mt_runtime_rank(rt) == recover_rank) {
        /* An error the program handles: after mt_clear_error, mt_finalize waits as usual. */
        mt_error_set(MT_ERR_NOT_FOUND, "an optional file is missing (handled)");
        mt_clear_error();
    }
    /* Every rank is past mt_init (its endpoints made) before the failing one gives up: what is
     * tested is the others waiting in mt_mesh_create, not in their own start. */
    if (st == MT_OK && before_mesh) st = mt_barrier(mt_runtime_world(rt), NULL);
    if (st == MT_OK && before_mesh && mt_runtime_rank(rt) == fail_rank) {
        st = mt_error_set(MT_ERR_INVALID_ARG, "the configuration is unreadable (a bug on purpose)");
        fprintf(stderr, "prog_module_error: %s\n", mt_last_error());
        mt_finalize(rt);
        return 1;
    }
    mt_mesh *mesh = NULL;
    mt_module *net = NULL, *fc1 = NULL;
    static const mt_module_ops fc_ops = {.forward = fc_forward};
    if (st == MT_OK)
        st = mt_mesh_create(rt, 1, (int[]){mt_runtime_world_size(rt)}, (const char *[]){"dp"},
                            &mesh);
    if (st == MT_OK) st = mt_module_create(mesh, "net", NULL, NULL, &net);
    if (st == MT_OK) st = mt_module_create(mesh, "fc1", &fc_ops, NULL, &fc1);
    if (st == MT_OK) st = mt_module_add_child(net, fc1);
    if (st != MT_OK) mt_module_destroy(fc1);
    if (st == MT_OK) st = mt_module_forward(net, rt);
    if (st == MT_OK) {
        printf("rank %d: forward ok\n", mt_runtime_rank(rt));
    } else {
        fprintf(stderr, "prog_module_error: %s\n", mt_last_error());
        if (use_abort) mt_abort(rt, st);
    }
    mt_module_destroy(net);
    mt_mesh_destroy(mesh);
    if (rt) mt_finalize(rt);
    return st == MT_OK ? 0 : 1;
}
