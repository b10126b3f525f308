/* The module tree's guards for user code (module/module.c), on one process: names are unique in
 * a tree (a clash directly, deep inside an added subtree, and not across separate trees), and
 * mt_param_f32 hands out f32 values only (before sharding; NULL with a reason while sharded and
 * when FSDP computes in bf16). */
#include "check.h"

#include <meshtrain/meshtrain.h>

#include <string.h>

static void check_unique_names(mt_mesh *mesh) {
    mt_module *net = NULL, *fc1 = NULL, *block = NULL, *inner = NULL, *dup = NULL, *other = NULL;
    CHECK_OK(mt_module_create(mesh, "net", NULL, NULL, &net));
    CHECK_OK(mt_module_create(mesh, "fc1", NULL, NULL, &fc1));
    CHECK_OK(mt_module_create(mesh, "block", NULL, NULL, &block));
    CHECK_OK(mt_module_create(mesh, "fc1", NULL, NULL, &inner));
    CHECK_OK(mt_module_create(mesh, "net", NULL, NULL, &dup));
    CHECK_OK(mt_module_create(mesh, "fc1", NULL, NULL, &other)); /* its own tree: fine */
    if (!net || !fc1 || !block || !inner || !dup || !other) return;
    CHECK_OK(mt_module_add_child(net, fc1));
    CHECK(mt_module_add_child(net, dup) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "already has a module named 'net'"), "%s", mt_last_error());
    /* A subtree whose module deep inside clashes with the tree it joins. */
    CHECK_OK(mt_module_add_child(block, inner));
    CHECK(mt_module_add_child(net, block) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "cannot add module 'block' under 'net': the tree of 'net' "
                                      "already has a module named 'fc1'"),
              "%s", mt_last_error());
    CHECK(mt_module_child_count(net) == 1);
    mt_module_destroy(net);
    mt_module_destroy(block); /* and inner, its child */
    mt_module_destroy(dup);
    mt_module_destroy(other);
}

static bool bf16_refused;

static mt_status read_as_f32(mt_module *m, void *ctx) {
    (void)ctx;
    mt_param *w = mt_module_param(m, 0);
    float *v = mt_param_f32(w);
    bf16_refused = v == NULL && strstr(mt_last_error(), "holds bf16 values") &&
                   strstr(mt_last_error(), "'w' of module 'lin'");
    return MT_OK;
}

static void check_param_f32(mt_mesh *mesh, mt_dtype param_dtype) {
    static const mt_module_ops ops = {.forward = read_as_f32};
    mt_module *lin = NULL;
    mt_param *w = NULL;
    CHECK_OK(mt_module_create(mesh, "lin", &ops, NULL, &lin));
    if (!lin) return;
    CHECK_OK(mt_module_add_param(lin, "w", 2, (int64_t[]){4, 3}, (mt_tp_placement){0}, &w));
    if (!w) return;
    float *v = mt_param_f32(w); /* before sharding: the f32 values themselves */
    CHECK(v != NULL && v == mt_param_data(w));
    mt_fsdp_options o = mt_fsdp_defaults(mesh, "dp");
    o.param_dtype = param_dtype;
    CHECK_OK(mt_fsdp_shard(lin, &o));
    CHECK(mt_param_f32(w) == NULL); /* sharded */
    CHECK(strstr(mt_last_error(), "is sharded") != NULL);
    bf16_refused = false;
    CHECK_OK(mt_module_forward(lin, NULL));
    CHECK(bf16_refused == (param_dtype == MT_BF16));
    CHECK(mt_param_f32(NULL) == NULL);
    mt_module_destroy(lin);
}

int main(void) {
    mt_runtime *rt = NULL;
    CHECK_OK(mt_init(&rt, NULL, NULL));
    if (!rt) return check_report("test_module_tree");
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 1, (int[]){1}, (const char *[]){"dp"}, &mesh));
    if (mesh) {
        check_unique_names(mesh);
        check_param_f32(mesh, MT_F32);
        check_param_f32(mesh, MT_BF16);
        mt_mesh_destroy(mesh);
    }
    mt_finalize(rt);
    return check_report("test_module_tree");
}
