/* Ranks whose models differ are refused at mt_fsdp_shard, on every rank, with the first
 * difference named (fsdp/fsdp_agree.c): the last rank has an extra parameter, then (second
 * model) a parameter of another shape. Ranks of other FSDP groups may hold other models (pipeline
 * stages): with --stages, a {"stage", "dp"} mesh whose two stages differ shards fine. Run under
 * mtrun with 2 or more ranks (an even number with --stages); exits 0 when every check passed. */
#include "check.h"

#include <meshtrain/meshtrain.h>

#include <stdio.h>
#include <string.h>

/* "net" with w [8x4] and b [8] (+ on the last rank: extra [4], or w of 8x5 with odd_shape). */
static mt_status build(mt_mesh *mesh, bool differ, bool odd_shape, mt_module **out) {
    mt_module *net = NULL;
    MT_TRY(mt_module_create(mesh, "net", NULL, NULL, &net));
    int64_t w_shape[2] = {8, differ && odd_shape ? 5 : 4}, b_shape[1] = {8}, e_shape[1] = {4};
    mt_status st = mt_module_add_param(net, "w", 2, w_shape, (mt_tp_placement){0}, NULL);
    if (st == MT_OK) st = mt_module_add_param(net, "b", 1, b_shape, (mt_tp_placement){0}, NULL);
    if (st == MT_OK && differ && !odd_shape)
        st = mt_module_add_param(net, "extra", 1, e_shape, (mt_tp_placement){0}, NULL);
    if (st != MT_OK) mt_module_destroy(net);
    else *out = net;
    return st;
}

static void expect_refused(mt_mesh *mesh, bool differ, bool odd_shape, const char *want) {
    mt_module *net = NULL;
    CHECK_OK(build(mesh, differ, odd_shape, &net));
    if (!net) return;
    mt_fsdp_options o = mt_fsdp_defaults(mesh, "dp");
    CHECK(mt_fsdp_shard(net, &o) == MT_ERR_MISMATCH);
    CHECK_MSG(strstr(mt_last_error(), want) != NULL, "\n  got:  %s\n  want: ...%s...",
              mt_last_error(), want);
    mt_module_destroy(net);
}

/* Two stages of a pipeline, each its own model, sharded over their own "dp" groups. */
static void check_stages(mt_runtime *rt) {
    int world = mt_runtime_world_size(rt);
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 2, (int[]){2, world / 2}, (const char *[]){"stage", "dp"},
                            &mesh));
    if (!mesh) return;
    bool second_stage = mt_mesh_coord(mesh, 0) == 1;
    mt_module *net = NULL;
    CHECK_OK(build(mesh, second_stage, false, &net));
    mt_fsdp_options o = mt_fsdp_defaults(mesh, "dp");
    if (net) CHECK_OK(mt_fsdp_shard(net, &o));
    mt_module_destroy(net);
    mt_mesh_destroy(mesh);
}

int main(int argc, char **argv) {
    bool stages = argc > 1 && strcmp(argv[1], "--stages") == 0;
    mt_runtime *rt = NULL;
    CHECK_OK(mt_init(&rt, &argc, &argv));
    if (!rt) return check_report("prog_fsdp_mismatch");
    if (stages) {
        check_stages(rt);
        mt_finalize(rt);
        return check_report("prog_fsdp_mismatch");
    }
    int world = mt_runtime_world_size(rt), last = world - 1;
    bool differ = mt_runtime_rank(rt) == last;
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 1, (int[]){world}, (const char *[]){"dp"}, &mesh));
    if (mesh && world > 1) {
        char want[256];
        snprintf(want, sizeof want, "mt_fsdp_shard('net'): the ranks disagree: the unit's "
                 "parameters differ on rank %d of group 'dp' from rank 0's: at parameter 3, "
                 "rank 0 has none (its list ends), rank %d has net.extra [4]", last, last);
        expect_refused(mesh, differ, false, want);
        snprintf(want, sizeof want, "at parameter 1, rank 0 has net.w [8x4], rank %d has net.w "
                 "[8x5]", last);
        expect_refused(mesh, differ, true, want);
        /* The same model everywhere still shards. */
        mt_module *net = NULL;
        CHECK_OK(build(mesh, false, false, &net));
        mt_fsdp_options o = mt_fsdp_defaults(mesh, "dp");
        if (net) CHECK_OK(mt_fsdp_shard(net, &o));
        mt_module_destroy(net);
    }
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    return check_report("prog_fsdp_mismatch");
}
