/* The tensor-parallel dimension a module places its parameters on (module/module.c,
 * tp/tp_linear.c) on one process: the default, a dimension named by the program, the refusals
 * (too late, a child on another dimension) and the tp context of a named dimension. A two-rank
 * run with a renamed dimension is tests/tp's tp_equiv_tp2_named_dim. */
#include "check.h"

#include <meshtrain/meshtrain.h>

#include <string.h>

static void check_tp_dim(mt_mesh *mesh) {
    mt_module *root = NULL, *child = NULL, *other = NULL;
    CHECK_OK(mt_module_create(mesh, "root", NULL, NULL, &root));
    CHECK_OK(mt_module_create(mesh, "child", NULL, NULL, &child));
    CHECK_OK(mt_module_create(mesh, "other", NULL, NULL, &other));
    if (!root || !child || !other) return;
    CHECK(strcmp(mt_module_tp_dim(root), MT_TP_DIM_DEFAULT) == 0);

    CHECK_OK(mt_module_set_tp_dim(root, "model"));
    CHECK_OK(mt_module_set_tp_dim(child, "model"));
    CHECK(strcmp(mt_module_tp_dim(root), "model") == 0);
    CHECK(mt_module_set_tp_dim(root, "") == MT_ERR_INVALID_ARG);
    CHECK(strcmp(mt_module_tp_dim(root), "model") == 0);

    /* A child on another dimension is refused with both names. */
    CHECK(mt_module_add_child(root, other) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "'model'") && strstr(mt_last_error(), "'" MT_TP_DIM_DEFAULT "'"));
    CHECK_OK(mt_module_add_child(root, child));
    CHECK(mt_module_set_tp_dim(child, "tp") == MT_ERR_INVALID_ARG); /* it has a parent now */

    /* The mesh has no "model" dimension: tp size 1, a Shard parameter holds all its rows. */
    mt_param *w = NULL;
    CHECK_OK(mt_module_add_param(child, "w", 2, (int64_t[]){6, 4},
                                 (mt_tp_placement){MT_TP_SHARD, 0}, &w));
    if (w) CHECK(mt_param_local_dim(w, 0) == 6);
    CHECK(mt_module_set_tp_dim(child, "dp") == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "already has parameters") != NULL);

    mt_tp_ctx tp;
    CHECK_OK(mt_tp_context_dim(mesh, "model", &tp));
    CHECK(tp.size == 1 && tp.rank == 0 && tp.group == NULL);
    mt_tp_context_release(&tp);
    CHECK(tp.scratch == NULL);
    CHECK_OK(mt_tp_context_dim(mesh, "dp", &tp)); /* a dimension that exists: its group */
    CHECK(tp.size == 1 && tp.group != NULL);
    mt_tp_context_release(&tp);
    CHECK(mt_tp_context_dim(mesh, NULL, &tp) == MT_ERR_INVALID_ARG);

    mt_module_destroy(root);
    mt_module_destroy(other);
}

int main(void) {
    mt_runtime *rt = NULL;
    CHECK_OK(mt_init(&rt, NULL, NULL));
    if (!rt) return check_report("test_module_tp_dim");
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 1, (int[]){1}, (const char *[]){"dp"}, &mesh));
    if (mesh) {
        check_tp_dim(mesh);
        mt_mesh_destroy(mesh);
    }
    mt_finalize(rt);
    return check_report("test_module_tp_dim");
}
