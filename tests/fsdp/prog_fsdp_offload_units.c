/* Which units the offload ratio offloads, at the FSDP engine level, on every rank of the launch:
 * an MLP of 7 layers (8 units with the root, sharded layers first) is sharded with
 * MT_OFFLOAD_FULL and ratios 0, 0.25, 0.3, 0.5 and 1. For each unit the test checks the policy
 * the engine chose, that its master and gradient shards and its AdamW state are in the host tier
 * exactly when it is offloaded (on the device otherwise), and that the memory accounting's device
 * and host categories (params, grads, optimizer) grew by exactly the resident and offloaded units'
 * shard bytes. The expected units are listed by hand from the rule in docs/offload.md (unit k
 * offloaded when floor((k + 1) R) > floor(k R)), and the rule computed here must give the same.
 *
 * Then the teardown of an offloaded model whose staging copy failed (MT_TEST_STAGE_COPY_FAIL=1,
 * a copy started and never waited for) reports that failure on stderr, naming the unit, instead
 * of dropping it.
 * usage: prog_fsdp_offload_units */
#include "check.h"
#include "comm/host/stage.h"
#include "core/device_internal.h"
#include "fsdp/fsdp_internal.h"
#include "fsdp/fsdp_offload.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LAYERS 7
#define UNITS (LAYERS + 1)
#define WIDTH 24

typedef struct ratio_case {
    float ratio;
    int offloaded[UNITS]; /* 1: unit k offloaded (written from the docs' rule by hand) */
} ratio_case;

static const ratio_case cases[] = {
    {0.0f, {0, 0, 0, 0, 0, 0, 0, 0}},
    {0.25f, {0, 0, 0, 1, 0, 0, 0, 1}},
    {0.3f, {0, 0, 0, 1, 0, 0, 1, 0}},
    {0.5f, {0, 1, 0, 1, 0, 1, 0, 1}},
    {1.0f, {1, 1, 1, 1, 1, 1, 1, 1}},
};

static mt_module *unit_module(mt_mlp *mlp, int k) {
    return k < LAYERS ? mt_mlp_layer(mlp, k) : mt_mlp_root(mlp);
}

static void stats(mt_device *dev, mt_mem_stats *d, mt_mem_stats *h) {
    mt_device_mem_stats(dev, d);
    mt_host_mem_stats(dev, h);
}

static mt_status build(mt_mesh *mesh, float ratio, mt_mlp **mlp) {
    mt_mlp_config cfg = {.layers = LAYERS, .in_dim = WIDTH, .width = WIDTH, .out_dim = WIDTH,
                         .seed = 5, .defer_init = true};
    MT_TRY(mt_mlp_create(mesh, &cfg, mlp));
    mt_fsdp_options o = mt_fsdp_defaults(mesh, "dp");
    o.offload = MT_OFFLOAD_FULL;
    o.offload_ratio = ratio;
    for (int k = 0; k < UNITS; k++) MT_TRY(mt_fsdp_shard(unit_module(*mlp, k), &o));
    return mt_module_init_params(mt_mlp_root(*mlp));
}

static void test_ratio(mt_mesh *mesh, mt_device *dev, const ratio_case *c) {
    mt_mem_stats d0, h0, d1, h1;
    stats(dev, &d0, &h0);
    mt_mlp *mlp = NULL;
    mt_adamw *opt = NULL;
    CHECK_OK(build(mesh, c->ratio, &mlp));
    if (mlp) CHECK_OK(mt_adamw_create(mt_mlp_root(mlp), &(mt_adamw_options){.lr = 1e-3f}, &opt));
    if (!opt) {
        mt_mlp_destroy(mlp);
        return;
    }
    stats(dev, &d1, &h1);
    size_t dev_bytes = 0, host_bytes = 0;
    int n_off = 0;
    for (int k = 0; k < UNITS; k++) {
        /* The docs' rule, computed as written there, agrees with the hand-made table. */
        double r = c->ratio;
        int rule = floor((double)(k + 1) * r) > floor((double)k * r);
        CHECK_MSG(rule == c->offloaded[k], "ratio %g, unit %d: the rule gives %d, the table %d",
                  (double)c->ratio, k, rule, c->offloaded[k]);
        mt_fsdp_unit *u = mt_fsdp_unit_of(unit_module(mlp, k));
        if (!u) {
            CHECK_MSG(0, "unit %d has no FSDP unit", k);
            continue;
        }
        bool off = u->offload != MT_OFFLOAD_NONE;
        CHECK_MSG(off == (c->offloaded[k] != 0), "ratio %g, unit %d ('%s'): %s, expected %s",
                  (double)c->ratio, k, u->module->name, off ? "offloaded" : "resident",
                  c->offloaded[k] ? "offloaded" : "resident");
        CHECK_MSG(!off || u->offload == MT_OFFLOAD_FULL, "unit %d: policy %d", k, (int)u->offload);
        size_t shard = u->S * sizeof(float);
        if (off) {
            host_bytes += shard;
            n_off++;
        } else {
            dev_bytes += shard;
        }
        float *m = NULL, *v = NULL;
        size_t n = 0;
        CHECK_OK(mt_adamw_state(opt, (size_t)k, &m, &v, &n));
        CHECK(n == u->S);
        if (u->S == 0) continue;
        /* Where the master, the gradient shard and AdamW's m and v are. */
        bool in_host = mt_host_tier_contains(dev, u->master, shard) &&
                       mt_host_tier_contains(dev, u->grad_shard, shard) &&
                       mt_host_tier_contains(dev, m, 2 * shard);
        bool on_dev = mt_device_contains(dev, u->master, shard) &&
                      mt_device_contains(dev, u->grad_shard, shard) &&
                      mt_device_contains(dev, m, 2 * shard);
        CHECK_MSG(off ? in_host && !on_dev : on_dev && !in_host,
                  "ratio %g, unit %d: master/grad/optimizer state %s the host tier",
                  (double)c->ratio, k, in_host ? "in" : "not (all) in");
    }
    /* FULL keeps nothing of an offloaded unit on the device between uses; the host tier holds its
     * f32 master (params), gradient (grads) and m, v (optimizer); a resident unit the same on the
     * device. */
    struct {
        mt_mem_category cat;
        size_t mult;
    } cats[] = {{MT_MEM_PARAMS, 1}, {MT_MEM_GRADS, 1}, {MT_MEM_OPTIMIZER, 2}};
    for (size_t i = 0; i < sizeof cats / sizeof *cats; i++) {
        mt_mem_category cat = cats[i].cat;
        size_t dd = d1.current[cat] - d0.current[cat], hd = h1.current[cat] - h0.current[cat];
        CHECK_MSG(dd == cats[i].mult * dev_bytes && hd == cats[i].mult * host_bytes,
                  "ratio %g, %s: device +%zu (expected %zu), host tier +%zu (expected %zu)",
                  (double)c->ratio, mt_mem_category_name(cat), dd, cats[i].mult * dev_bytes, hd,
                  cats[i].mult * host_bytes);
    }
    printf("ratio %.2f: %d of %d units offloaded; device params +%zu B, host tier params +%zu B\n",
           (double)c->ratio, n_off, UNITS, d1.current[MT_MEM_PARAMS] - d0.current[MT_MEM_PARAMS],
           h1.current[MT_MEM_PARAMS] - h0.current[MT_MEM_PARAMS]);
    mt_adamw_destroy(opt);
    mt_mlp_destroy(mlp);
    stats(dev, &d1, &h1);
    CHECK_MSG(h1.total_current == h0.total_current, "ratio %g: the host tier holds %zu B after "
              "the model went, %zu before", (double)c->ratio, h1.total_current, h0.total_current);
}

/* A staging copy that failed and was never waited for: the model's teardown says so. */
static void test_teardown_report(mt_mesh *mesh) {
    mt_mlp *mlp = NULL;
    CHECK_OK(build(mesh, 1.0f, &mlp));
    if (!mlp) return;
    mt_fsdp_unit *u = mt_fsdp_unit_of(mt_mlp_layer(mlp, 2));
    CHECK(u && u->S > 0);
    struct mt_stager *stager = mt_fsdp_offload_stager(u);
    CHECK(stager != NULL);
    if (stager) mt_stager_inject_copy_failure(stager, true);
    mt_status st = u ? mt_fsdp_offload_stage_start(u) : MT_ERR_INTERNAL;
    if (stager) mt_stager_inject_copy_failure(stager, false);
    CHECK_OK(st); /* started: it fails on the staging thread */
    CHECK(u && u->param_copy);

    char path[] = "/tmp/prog_fsdp_offload_units.XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) {
        mt_mlp_destroy(mlp);
        return;
    }
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    mt_mlp_destroy(mlp);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char buf[8192] = {0};
    ssize_t got = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    unlink(path);
    buf[got > 0 ? got : 0] = '\0';
    CHECK_MSG(strstr(buf, "waiting for its parameter staging copy") &&
                  strstr(buf, "unit 'layer2'") && strstr(buf, "MT_TEST_STAGE_COPY_FAIL"),
              "the teardown did not report the failed staging copy; it logged: '%s'", buf);
    printf("teardown reported: %s", buf);
}

int main(int argc, char **argv) {
    mt_runtime *rt = NULL;
    if (mt_init(&rt, &argc, &argv) != MT_OK) {
        fprintf(stderr, "mt_init: %s\n", mt_last_error());
        return 1;
    }
    int world = mt_runtime_world_size(rt);
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 1, &world, (const char *[]){"dp"}, &mesh));
    mt_device *dev = mt_runtime_device(rt);
    if (mesh) {
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) test_ratio(mesh, dev, &cases[i]);
        test_teardown_report(mesh);
        mt_mesh_destroy(mesh);
    }
    mt_finalize(rt);
    return check_report("prog_fsdp_offload_units");
}
