/* A save refused on one rank is refused on every rank, through mtrun on 2 ranks: initialising
 * deferred parameters is per rank (no collectives), so a program may leave a parameter without
 * values on one rank only. That rank refuses the save; the others must return the same refusal
 * instead of entering the save and waiting for it (until MT_TIMEOUT_S). Then, once the rank has
 * initialised it, the save succeeds everywhere.
 *
 *   mtrun --standalone --nproc_per_node 2 prog_ckpt_uninit DIR */
#include "check.h"

#include <meshtrain/meshtrain.h>

#include <stdio.h>
#include <string.h>
#include <time.h>

enum { LAZY_RANK = 1 };

int main(int argc, char **argv) {
    mt_runtime *rt = NULL;
    CHECK_OK(mt_init(&rt, &argc, &argv));
    if (!rt) return check_report("prog_ckpt_uninit");
    if (argc != 2) {
        fprintf(stderr, "usage: prog_ckpt_uninit DIR\n");
        return 2;
    }
    int rank = mt_runtime_rank(rt), world = mt_runtime_world_size(rt);
    if (world < 2) {
        fprintf(stderr, "FAIL: needs 2 or more ranks, has %d\n", world);
        return 1;
    }
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 1, (int[]){world}, (const char *[]){"dp"}, &mesh));
    mt_module *m = NULL;
    mt_param *w = NULL, *b = NULL;
    const mt_tp_placement rep = {MT_TP_REPLICATE, 0};
    CHECK_OK(mt_module_create(mesh, "uninit", NULL, NULL, &m));
    CHECK_OK(mt_module_add_param_deferred(m, "w", 2, (int64_t[]){6, 5}, rep, &w));
    CHECK_OK(mt_module_add_param_deferred(m, "b", 1, (int64_t[]){5}, rep, &b));
    mt_fsdp_options fo = mt_fsdp_defaults(mesh, "dp");
    CHECK_OK(mt_fsdp_shard(m, &fo));
    mt_initialiser normal = mt_init_normal(0.0, 0.02, 1, 0), zeros = mt_init_zeros();
    CHECK_OK(mt_param_init(b, &zeros));
    if (rank != LAZY_RANK) CHECK_OK(mt_param_init(w, &normal));

    mt_checkpoint_options o = mt_checkpoint_defaults();
    o.sync = true; /* the outcome, not only the staging's */
    o.step = 1;
    time_t t0 = time(NULL);
    mt_status st = mt_checkpoint_save(m, NULL, argv[1], &o);
    const char *msg = mt_last_error();
    CHECK_MSG(st == MT_ERR_INVALID_ARG && strstr(msg, "saving a checkpoint") &&
                  strstr(msg, "parameter 'w' of module 'uninit'"),
              "rank %d: save with 'w' uninitialised on rank %d: status %d (%s), '%s'; want the "
              "refusal naming parameter 'w' of module 'uninit'", rank, LAZY_RANK, (int)st,
              mt_status_str(st), st != MT_OK ? msg : "");
    if (rank != LAZY_RANK)
        CHECK_MSG(strstr(msg, "failed on rank 1"), "rank %d: the refusal does not say which rank "
                  "refused: '%s'", rank, msg);
    /* The agreement is one small collective: nothing waits for a timeout. */
    CHECK_MSG(time(NULL) - t0 <= 10, "rank %d: the refusal took %ld s", rank,
              (long)(time(NULL) - t0));
    /* Nothing was written, and the next save (everything initialised) succeeds everywhere. */
    if (rank == LAZY_RANK) CHECK_OK(mt_param_init(w, &normal));
    CHECK_OK(mt_checkpoint_save(m, NULL, argv[1], &o));
    mt_module_destroy(m);
    mt_mesh_destroy(mesh);
    char name[64];
    snprintf(name, sizeof name, "prog_ckpt_uninit rank %d", rank);
    int rc = check_report(name);
    mt_finalize(rt);
    return rc;
}
