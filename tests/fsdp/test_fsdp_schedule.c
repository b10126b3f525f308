/* FSDP's schedule on one process (fsdp/fsdp_schedule.c), no launcher: the order recorded on the
 * first step, the prefetch and collective counters of the next, the switches (no prefetch, no
 * gradient sync), FSDP's hooks nesting with a user's hooks on the same unit, and that destroying
 * the model gives every unit's memory back.
 *
 *   root (r[3]) -> l0 (w[4]), l1 (m[2x3]), l2 (s[5]); the layers and then the root are units.
 */
#include "check.h"
#include "core/error.h"
#include "fsdp/fsdp_internal.h"

#include <meshtrain/meshtrain.h>

#include <string.h>

#define NL 3

/* A backward that forgets this child (check_forgotten_backward). */
static mt_module *forgotten;

/* Counts the module functions run (ctx: an int), runs the children (forward in order, backward
 * in reverse), checks that the module's parameters are gathered and writes a gradient of 1. */
static mt_status step(mt_module *m, int *calls, bool backward) {
    ++*calls;
    size_t n = mt_module_child_count(m);
    for (size_t k = 0; k < n; k++) {
        mt_module *c = mt_module_child(m, backward ? n - 1 - k : k);
        if (backward && c == forgotten) continue;
        MT_TRY(backward ? mt_module_backward(c, calls) : mt_module_forward(c, calls));
    }
    for (size_t i = 0; i < mt_module_param_count(m); i++) {
        mt_param *p = mt_module_param(m, i);
        if (!mt_param_data(p) || (backward && !mt_param_grad(p)))
            return mt_error(MT_ERR_INTERNAL, "'%s.%s' not gathered", mt_module_name(m),
                            mt_param_name(p));
        if (backward)
            for (size_t j = 0; j < mt_param_numel(p); j++) mt_param_grad(p)[j] += 1.0f;
    }
    return MT_OK;
}
static mt_status fwd(mt_module *m, void *ctx) { return step(m, ctx, false); }
static mt_status bwd(mt_module *m, void *ctx) { return step(m, ctx, true); }

typedef struct model {
    mt_module *root, *l[NL];
} model;

static mt_status build(mt_mesh *mesh, model *md) {
    static const mt_module_ops ops = {.forward = fwd, .backward = bwd};
    static const char *names[NL] = {"l0", "l1", "l2"};
    static const int64_t shapes[NL][2] = {{4, 1}, {2, 3}, {5, 1}};
    const mt_tp_placement rep = {MT_TP_REPLICATE, 0};
    MT_TRY(mt_module_create(mesh, "root", &ops, NULL, &md->root));
    MT_TRY(mt_module_add_param(md->root, "r", 1, (int64_t[]){3}, rep, NULL));
    for (int i = 0; i < NL; i++) {
        MT_TRY(mt_module_create(mesh, names[i], &ops, NULL, &md->l[i]));
        MT_TRY(mt_module_add_child(md->root, md->l[i]));
        MT_TRY(mt_module_add_param(md->l[i], "p", 2, shapes[i], rep, NULL));
    }
    mt_fsdp_options o = mt_fsdp_defaults(mesh, "dp");
    for (int i = 0; i < NL; i++) MT_TRY(mt_fsdp_shard(md->l[i], &o));
    return mt_fsdp_shard(md->root, &o);
}

/* One forward and backward: every module's function runs once in each. */
static mt_status train_step(model *md) {
    int calls = 0;
    MT_TRY(mt_module_forward(md->root, &calls));
    MT_TRY(mt_module_backward(md->root, &calls));
    if (calls == 2 * (NL + 1)) return MT_OK;
    return mt_error(MT_ERR_INTERNAL, "a step ran %d module functions, expected %d", calls,
                    2 * (NL + 1));
}

static void expect_order(model *md, bool backward, mt_module *const *want, size_t n_want) {
    mt_module *got[8];
    size_t n = 0;
    CHECK_OK(mt_fsdp_debug_order(md->root, backward, got, 8, &n));
    CHECK_MSG(n == n_want, "%s order: %zu units, want %zu", backward ? "backward" : "forward", n,
              n_want);
    for (size_t i = 0; i < n && i < n_want; i++)
        CHECK_MSG(got[i] == want[i], "%s order [%zu]: '%s', want '%s'",
                  backward ? "backward" : "forward", i, mt_module_name(got[i]),
                  mt_module_name(want[i]));
}

static mt_fsdp_debug counters(mt_module *m) {
    mt_fsdp_debug d = {0};
    CHECK_OK(mt_fsdp_debug_get(m, &d));
    return d;
}

/* Recorded order after one step; per step after that: every layer gathered twice (forward,
 * backward), each gather prefetched by the unit before it, one reduce-scatter per unit, at most
 * one outstanding. The root keeps its parameters from forward to backward. */
static void check_schedule(model *md) {
    size_t n = 0;
    CHECK_OK(mt_fsdp_debug_order(md->root, false, NULL, 0, &n));
    CHECK(n == 0);
    CHECK_OK(train_step(md));
    expect_order(md, false, (mt_module *[]){md->root, md->l[0], md->l[1], md->l[2]}, 4);
    expect_order(md, true, (mt_module *[]){md->root, md->l[2], md->l[1], md->l[0]}, 4);
    for (int i = 0; i < NL; i++) {
        mt_fsdp_debug d = counters(md->l[i]);
        CHECK_MSG(d.all_gathers == 2 && d.prefetches == 0 && d.reduce_scatters == 1 &&
                  d.max_outstanding_rs == 0, "step 1, l%d: %ld gathers, %ld prefetched, %ld "
                  "reduce-scatters, %d", i, d.all_gathers, d.prefetches, d.reduce_scatters,
                  d.max_outstanding_rs);
    }
    CHECK_OK(train_step(md));
    for (int i = 0; i < NL; i++) {
        mt_fsdp_debug d = counters(md->l[i]);
        CHECK_MSG(d.all_gathers == 4 && d.prefetches == 2 && d.reduce_scatters == 2,
                  "step 2, l%d: %ld gathers, %ld prefetched, %ld reduce-scatters", i,
                  d.all_gathers, d.prefetches, d.reduce_scatters);
    }
    mt_fsdp_debug r = counters(md->root);
    CHECK_MSG(r.all_gathers == 2 && r.prefetches == 0 && r.reduce_scatters == 2 &&
              r.max_outstanding_rs == 1, "root: %ld gathers, %ld prefetched, %ld "
              "reduce-scatters, at most %d outstanding", r.all_gathers, r.prefetches,
              r.reduce_scatters, r.max_outstanding_rs);

    /* Switches: no prefetch, then no gradient sync (no reduce-scatter at all). */
    CHECK_OK(mt_fsdp_set_prefetch(md->root, false));
    CHECK_OK(mt_fsdp_set_requires_gradient_sync(md->root, false));
    CHECK_OK(train_step(md));
    mt_fsdp_debug d = counters(md->l[1]);
    CHECK_MSG(d.all_gathers == 6 && d.prefetches == 2 && d.reduce_scatters == 2,
              "no prefetch, no sync: %ld gathers, %ld prefetched, %ld reduce-scatters",
              d.all_gathers, d.prefetches, d.reduce_scatters);
    CHECK_OK(mt_fsdp_set_prefetch(md->root, true));
    CHECK_OK(mt_fsdp_set_requires_gradient_sync(md->root, true));
}

/* A user's hooks registered on a unit after sharding run inside FSDP's: the parameter is
 * gathered in the user's pre hook and still gathered in its post hook. */
static int user_seen;
static mt_status user_pre(mt_module *m, void *user) {
    (void)user;
    if (mt_param_data(mt_module_param(m, 0))) user_seen++;
    return MT_OK;
}
static mt_status user_post(mt_module *m, void *user, mt_status st) {
    (void)user;
    if (mt_param_data(mt_module_param(m, 0))) user_seen++;
    return st;
}

static void check_nesting(model *md) {
    static const mt_module_hooks user = {user_pre, user_post, user_pre, user_post, NULL};
    CHECK_OK(mt_module_add_hooks(md->l[1], &user, &user, NULL));
    user_seen = 0;
    CHECK_OK(train_step(md));
    CHECK_MSG(user_seen == 4, "the user's hooks saw the parameter gathered %d times of 4",
              user_seen);
    CHECK_OK(mt_module_remove_hooks(md->l[1], &user));
    CHECK(mt_fsdp_unit_of(md->l[1]) != NULL);
}

/* The structure is fixed once sharded, with the message naming FSDP. */
static void check_sealed(mt_mesh *mesh, model *md) {
    const mt_tp_placement rep = {MT_TP_REPLICATE, 0};
    CHECK(mt_module_add_param(md->l[0], "late", 1, (int64_t[]){2}, rep, NULL) ==
          MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "already inside an FSDP unit"), "%s", mt_last_error());
    mt_module *late = NULL;
    CHECK_OK(mt_module_create(mesh, "late", NULL, NULL, &late));
    CHECK(mt_module_add_child(md->l[2], late) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "build the whole model before sharding"), "%s",
              mt_last_error());
    mt_module_destroy(late);
}

/* A unit whose forward ran but whose backward did not is reported once (a warning), and only
 * after a pass with a backward: evaluation passes are forward only. */
static void check_forgotten_backward(model *md) {
    int calls = 0;
    CHECK_OK(mt_module_forward(md->root, &calls)); /* evaluation: no backward, no warning */
    for (int i = 0; i < NL; i++) CHECK(!mt_fsdp_unit_of(md->l[i])->warned_no_backward);
    forgotten = md->l[1];
    for (int s = 0; s < 2; s++) {
        CHECK_OK(mt_module_forward(md->root, &calls));
        CHECK_OK(mt_module_backward(md->root, &calls));
    }
    forgotten = NULL;
    for (int i = 0; i < NL; i++)
        CHECK_MSG(mt_fsdp_unit_of(md->l[i])->warned_no_backward == (i == 1),
                  "unit '%s': warned %d", mt_module_name(md->l[i]),
                  (int)mt_fsdp_unit_of(md->l[i])->warned_no_backward);
    CHECK(!mt_fsdp_unit_of(md->root)->warned_no_backward);
    CHECK_OK(train_step(md)); /* whole again */
}

int main(void) {
    mt_runtime *rt = NULL;
    CHECK_OK(mt_init(&rt, NULL, NULL));
    if (!rt) return check_report("test_fsdp_schedule");
    mt_device *dev = mt_runtime_device(rt);
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 1, (int[]){1}, (const char *[]){"dp"}, &mesh));
    model md = {0};
    if (mesh && build(mesh, &md) == MT_OK) {
        check_schedule(&md);
        check_nesting(&md);
        check_sealed(mesh, &md);
        check_forgotten_backward(&md);
    } else {
        CHECK_MSG(0, "building the model: %s", mt_last_error());
    }
    mt_module_destroy(md.root);
    mt_mem_stats ms;
    mt_device_mem_stats(dev, &ms);
    CHECK_MSG(ms.current[MT_MEM_PARAMS] == 0 && ms.current[MT_MEM_GRADS] == 0 &&
              ms.current[MT_MEM_COMM] == 0, "after destroy: params %zu, grads %zu, comm %zu bytes",
              (size_t)ms.current[MT_MEM_PARAMS], (size_t)ms.current[MT_MEM_GRADS],
              (size_t)ms.current[MT_MEM_COMM]);
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    return check_report("test_fsdp_schedule");
}
