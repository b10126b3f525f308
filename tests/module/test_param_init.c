/* Deferred parameters and the library initialisers (module/param_init.c), through mtrun on 1 rank,
 * dp 4, and dp 2 x tp 2 (argument "tp2"):
 *   - a model of deferred parameters of several shapes and placements (Shard(0) with padding rows,
 *     Shard(1), Replicate, a scalar; odd sizes, so FSDP pads its flat buffers) is sharded without
 *     any per-parameter allocation, refuses a forward, a gather and an optimizer step while
 *     uninitialised (naming the parameter), then is initialised shard by shard;
 *   - every gathered tp-local value equals, bit for bit, the value of the whole tensor initialised
 *     on this rank (a twin model whose tp dimension is absent from the mesh: tp size 1), bf16
 *     units as the whole tensor rounded to bf16; so the values are the same for any dp x tp;
 *   - the function initialiser sees global offsets (it writes each element's global linear index)
 *     in runs that stay within a row; padding rows stay 0;
 *   - bad input: one clear error each. */
#include "check.h"
#include "core/bf16_inline.h"
#include "fsdp/fsdp_internal.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { K_NORMAL, K_UNIFORM, K_ONES, K_FN, K_NORMAL_MEAN, N_PARAMS = 8 };

typedef struct spec {
    const char *name;
    int owner; /* 0: root, 1: l0, 2: l1 */
    int ndim;
    int64_t shape[3];
    mt_tp_placement tp;
    int64_t real_rows; /* 0: no padding */
    int kind;
} spec;

static const spec SPECS[N_PARAMS] = {
    {"a", 1, 2, {6, 10}, {MT_TP_SHARD, 0}, 5, K_NORMAL},
    {"b", 1, 3, {3, 4, 6}, {MT_TP_SHARD, 1}, 0, K_UNIFORM},
    {"c", 1, 1, {7}, {MT_TP_REPLICATE, 0}, 0, K_ONES},
    {"d", 2, 2, {4, 9}, {MT_TP_SHARD, 0}, 3, K_FN},
    {"e", 2, 0, {0}, {MT_TP_REPLICATE, 0}, 0, K_NORMAL},
    {"f", 0, 2, {8, 6}, {MT_TP_SHARD, 1}, 0, K_NORMAL_MEAN},
    /* 1-D with padding: a run spans dimension 0 itself, so it must be cut at real_rows (Shard(0)
     * on tp 2 puts the boundary inside tp rank 1's part). */
    {"g", 0, 1, {8}, {MT_TP_SHARD, 0}, 5, K_FN},
    {"h", 1, 1, {8}, {MT_TP_REPLICATE, 0}, 5, K_ONES},
};

static int fn_calls, fn_bad_runs;

/* Each element's value is its global linear index: the test sees where it was computed for. */
static mt_status index_fn(void *user, const mt_param *p, const int64_t *g, size_t count,
                          float *out) {
    (void)user;
    int nd = mt_param_ndim(p);
    fn_calls++;
    if (nd > 0 && g[nd - 1] + (int64_t)count > mt_param_global_dim(p, nd - 1)) fn_bad_runs++;
    if (nd > 0 && g[0] >= mt_param_real_rows(p)) fn_bad_runs++; /* never asked for padding */
    if (nd == 1 && g[0] + (int64_t)count > mt_param_real_rows(p)) fn_bad_runs++; /* nor in a run */
    int64_t lin = 0;
    for (int d = 0; d < nd; d++) lin = lin * mt_param_global_dim(p, d) + g[d];
    for (size_t j = 0; j < count; j++) out[j] = (float)(lin + (int64_t)j);
    return MT_OK;
}

static mt_initialiser make_init(int i) {
    switch (SPECS[i].kind) {
    case K_NORMAL: return mt_init_normal(0.0, 0.7, 11, (uint64_t)i);
    case K_UNIFORM: return mt_init_uniform(-2.0, 3.0, 11, (uint64_t)i);
    case K_ONES: return mt_init_ones();
    case K_FN: return mt_init_function(index_fn, NULL);
    default: return mt_init_normal(1.5, 0.5, 11, (uint64_t)i);
    }
}

typedef struct model {
    mt_module *mod[3]; /* root, l0, l1 */
    mt_param *p[N_PARAMS];
} model;

/* tp_dim "whole" is absent from every mesh here: tp size 1, the tp-local part is the tensor. */
static void build(mt_mesh *mesh, const char *tp_dim, model *m) {
    static const char *names[3] = {"root", "l0", "l1"};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(mt_module_create(mesh, names[i], NULL, NULL, &m->mod[i]));
        CHECK_OK(mt_module_set_tp_dim(m->mod[i], tp_dim));
    }
    CHECK_OK(mt_module_add_child(m->mod[0], m->mod[1]));
    CHECK_OK(mt_module_add_child(m->mod[0], m->mod[2]));
    for (int i = 0; i < N_PARAMS; i++) {
        const spec *s = &SPECS[i];
        CHECK_OK(mt_module_add_param_deferred(m->mod[s->owner], s->name, s->ndim, s->shape, s->tp,
                                              &m->p[i]));
        if (s->real_rows) CHECK_OK(mt_param_set_padding(m->p[i], s->real_rows));
    }
}

static size_t global_numel(int i) {
    size_t n = 1;
    for (int d = 0; d < SPECS[i].ndim; d++) n *= (size_t)SPECS[i].shape[d];
    return n;
}

/* The f32 values of p (values present) on the host. */
static float *read_host(mt_device *dev, mt_param *p) {
    size_t n = mt_param_numel(p);
    float *dev_buf = NULL, *host = malloc(n * sizeof *host);
    CHECK_OK(mt_device_alloc(dev, n * sizeof(float), MT_MEM_OTHER, (void **)&dev_buf));
    CHECK_OK(mt_param_read_f32(p, dev_buf));
    CHECK_OK(mt_device_copy(dev, host, dev_buf, n * sizeof(float), MT_COPY_DEVICE_TO_HOST, NULL));
    mt_device_free(dev, dev_buf);
    return host;
}

/* Compares p's tp-local values (this rank's tp coordinate tp_rank) with the whole tensor. */
static int compare_local(mt_param *p, int i, const float *local, const float *whole, int tp_rank,
                         bool bf16) {
    const spec *s = &SPECS[i];
    int nd = s->ndim, bad = 0;
    int64_t idx[3] = {0};
    for (size_t k = 0; k < mt_param_numel(p); k++) {
        int64_t lin = 0;
        for (int d = 0; d < nd; d++) {
            int64_t gi = idx[d];
            if (s->tp.kind == MT_TP_SHARD && s->tp.dim == d) gi += tp_rank * mt_param_local_dim(p, d);
            lin = lin * s->shape[d] + gi;
        }
        float want = bf16 ? mt_bf16_widen(mt_bf16_round(whole[lin])) : whole[lin];
        if (memcmp(&want, &local[k], sizeof want) != 0 && bad++ < 3)
            fprintf(stderr, "param %s local %zu (global %lld): %.9g, whole %.9g\n", s->name, k,
                    (long long)lin, (double)local[k], (double)want);
        for (int d = nd - 1; d >= 0; d--) {
            if (++idx[d] < mt_param_local_dim(p, d)) break;
            idx[d] = 0;
        }
    }
    return bad;
}

/* The whole tensors, initialised on this rank without sharding (allocating them). */
static float **whole_values(mt_mesh *mesh, mt_device *dev) {
    model w = {0};
    build(mesh, "whole", &w);
    float **vals = calloc(N_PARAMS, sizeof *vals);
    fn_bad_runs = 0;
    for (int i = 0; i < N_PARAMS; i++) {
        mt_initialiser init = make_init(i);
        CHECK_OK(mt_param_init(w.p[i], &init));
        CHECK(mt_param_numel(w.p[i]) == global_numel(i));
        vals[i] = read_host(dev, w.p[i]);
    }
    CHECK_MSG(fn_bad_runs == 0, "%d function runs reached padding rows", fn_bad_runs);
    mt_module_destroy(w.mod[0]);
    return vals;
}

static void check_whole(float **whole) {
    /* a: rows >= 5 are padding (zero); the others normal draws, not all alike. */
    bool pad_zero = true, varied = false;
    for (int k = 0; k < 60; k++) {
        if (k >= 50 && whole[0][k] != 0.0f) pad_zero = false;
        if (k > 0 && k < 50 && whole[0][k] != whole[0][0]) varied = true;
    }
    CHECK(pad_zero);
    CHECK(varied && whole[0][0] != 0.0f);
    bool in_range = true;
    for (int k = 0; k < 72; k++) in_range = in_range && whole[1][k] >= -2.0f && whole[1][k] <= 3.0f;
    CHECK(in_range);
    for (int k = 0; k < 7; k++) CHECK(whole[2][k] == 1.0f);
    /* d: the function wrote global indices into rows 0-2, row 3 is padding. */
    bool fn_ok = true;
    for (int k = 0; k < 36; k++) fn_ok = fn_ok && whole[3][k] == (k < 27 ? (float)k : 0.0f);
    CHECK(fn_ok);
    double mean = 0;
    for (int k = 0; k < 48; k++) mean += whole[5][k] / 48.0;
    CHECK_MSG(mean > 1.2 && mean < 1.8, "normal(1.5, 0.5) mean %g", mean);
    /* g, h: 1-D, rows 5-7 are padding (zero) for the function and for ones alike. */
    for (int k = 0; k < 8; k++) {
        CHECK_MSG(whole[6][k] == (k < 5 ? (float)k : 0.0f), "g[%d] = %g", k, (double)whole[6][k]);
        CHECK_MSG(whole[7][k] == (k < 5 ? 1.0f : 0.0f), "h[%d] = %g", k, (double)whole[7][k]);
    }
}

/* Before initialisation: forward, gather and the optimizer's step refuse, naming a parameter. */
static void check_refusals(model *m) {
    mt_status st = mt_module_forward(m->mod[0], NULL);
    CHECK(st == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "parameter 'f' of module 'root'") &&
                  strstr(mt_last_error(), "forward"), "%s", mt_last_error());
    st = mt_fsdp_unshard_issue(mt_fsdp_unit_of(m->mod[2]));
    CHECK(st == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "parameter 'd' of module 'l1'") &&
                  strstr(mt_last_error(), "gathering"), "%s", mt_last_error());
    mt_adamw *opt = NULL;
    mt_adamw_options ao = {.lr = 1e-3f};
    CHECK_OK(mt_adamw_create(m->mod[0], &ao, &opt)); /* a checkpoint could still be loaded */
    st = mt_adamw_step(opt);
    CHECK(st == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "optimizer") && strstr(mt_last_error(), "deferred"), "%s",
              mt_last_error());
    mt_adamw_destroy(opt);
    /* Refused before anything is written (the folder is never created). */
    st = mt_checkpoint_save(m->mod[0], NULL, "/nonexistent/test_param_init", NULL);
    CHECK(st == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "saving a checkpoint") && strstr(mt_last_error(), "'a'"),
              "%s", mt_last_error());
    for (int i = 0; i < N_PARAMS; i++) CHECK(mt_param_needs_init(m->p[i]));
}

static void check_sharded(mt_mesh *mesh, mt_device *dev, float **whole, int tp_rank) {
    model m = {0};
    build(mesh, "tp", &m);
    for (int i = 0; i < N_PARAMS; i++) {
        mt_initialiser init = make_init(i);
        CHECK_OK(mt_param_set_init(m.p[i], &init));
        CHECK(mt_param_data(m.p[i]) == NULL);
    }
    mt_mem_stats before, after;
    mt_device_reset_peaks(dev);
    mt_device_mem_stats(dev, &before);
    mt_fsdp_options fo = mt_fsdp_defaults(mesh, "dp");
    CHECK_OK(mt_fsdp_shard(m.mod[1], &fo));
    fo.param_dtype = MT_BF16; /* l1: the bf16 copy of the shard follows the initialiser */
    CHECK_OK(mt_fsdp_shard(m.mod[2], &fo));
    fo.param_dtype = MT_F32;
    CHECK_OK(mt_fsdp_shard(m.mod[0], &fo));
    mt_device_mem_stats(dev, &after);
    /* Only the shards: f32 masters (l1's in the optimizer category) and its bf16 copy. */
    size_t S[3];
    for (int u = 0; u < 3; u++) S[u] = mt_fsdp_unit_of(m.mod[u])->S;
    size_t want = (S[0] + S[1]) * 4 + S[2] * 2;
    CHECK_MSG(after.peak[MT_MEM_PARAMS] - before.current[MT_MEM_PARAMS] == want,
              "params peak while sharding %zu, shards %zu",
              after.peak[MT_MEM_PARAMS] - before.current[MT_MEM_PARAMS], want);
    check_refusals(&m);
    fn_calls = fn_bad_runs = 0;
    CHECK_OK(mt_module_init_params(m.mod[0]));
    CHECK(fn_bad_runs == 0);
    for (int i = 0; i < N_PARAMS; i++) CHECK(!mt_param_needs_init(m.p[i]));
    mt_device_mem_stats(dev, &before);
    CHECK(before.current[MT_MEM_PARAMS] == after.current[MT_MEM_PARAMS]); /* in place */
    /* Nothing more to do, and each parameter refuses a second initialiser. */
    CHECK_OK(mt_module_init_params(m.mod[0]));
    mt_initialiser ones = mt_init_ones();
    CHECK(mt_param_init(m.p[0], &ones) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "already holds values"), "%s", mt_last_error());
    for (int u = 0; u < 3; u++) {
        mt_fsdp_unit *unit = mt_fsdp_unit_of(m.mod[u]);
        CHECK_OK(mt_fsdp_unshard_wait(unit));
        for (int i = 0; i < N_PARAMS; i++) {
            if (SPECS[i].owner != u) continue;
            float *local = read_host(dev, m.p[i]);
            int bad = compare_local(m.p[i], i, local, whole[i], tp_rank, u == 2);
            CHECK_MSG(bad == 0, "param %s: %d values differ from the whole tensor's",
                      SPECS[i].name, bad);
            free(local);
        }
        CHECK_OK(mt_fsdp_reshard(unit));
    }
    mt_module_destroy(m.mod[0]);
}

static mt_status failing_fn(void *user, const mt_param *p, const int64_t *g, size_t count,
                            float *out) {
    (void)user, (void)p, (void)g, (void)count, (void)out;
    return mt_error_set(MT_ERR_INVALID_ARG, "no values today");
}

/* One clear error for each bad input. */
static void check_bad_input(mt_mesh *mesh) {
    mt_module *m = NULL;
    mt_param *d = NULL, *e = NULL, *d2 = NULL;
    int64_t shape[2] = {2, 3};
    mt_tp_placement rep = {MT_TP_REPLICATE, 0};
    CHECK_OK(mt_module_create(mesh, "bad", NULL, NULL, &m));
    CHECK_OK(mt_module_add_param_deferred(m, "d", 2, shape, rep, &d));
    CHECK_OK(mt_module_add_param_deferred(m, "d2", 2, shape, rep, &d2));
    CHECK_OK(mt_module_add_param(m, "eager", 2, shape, rep, &e));
    struct {
        mt_initialiser init;
        const char *says;
    } bad[] = {
        {mt_init_normal(0.0, -1.0, 1, 0), "std >= 0"},
        {mt_init_normal(NAN, 1.0, 1, 0), "finite"},
        {mt_init_uniform(3.0, 2.0, 1, 0), "low <= high"},
        {mt_init_function(NULL, NULL), "without a function"},
        {{.kind = (mt_init_kind)42}, "unknown initialiser kind 42"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(mt_param_init(d, &bad[i].init) == MT_ERR_INVALID_ARG);
        CHECK_MSG(strstr(mt_last_error(), bad[i].says) && strstr(mt_last_error(), "'d'"),
                  "%s", mt_last_error());
        CHECK(mt_param_set_init(d, &bad[i].init) == MT_ERR_INVALID_ARG);
    }
    CHECK(mt_param_needs_init(d) && mt_param_data(d) == NULL);
    /* A failing function: its message, the parameter named, nothing kept. */
    mt_initialiser failing = mt_init_function(failing_fn, NULL);
    CHECK(mt_param_init(d, &failing) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "no values today") && strstr(mt_last_error(), "'d'"), "%s",
              mt_last_error());
    CHECK(mt_param_needs_init(d) && mt_param_data(d) == NULL);
    mt_initialiser ones = mt_init_ones();
    CHECK(mt_param_init(e, &ones) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "'eager'") && strstr(mt_last_error(), "created with values"),
              "%s", mt_last_error());
    CHECK(mt_param_set_init(e, &ones) == MT_ERR_INVALID_ARG);
    /* An unsharded module's forward refuses its uninitialised parameter. */
    CHECK(mt_module_forward(m, NULL) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "parameter 'd' of module 'bad'"), "%s", mt_last_error());
    /* d2 has a record, d none: refused before d2 is touched. */
    CHECK_OK(mt_param_set_init(d2, &ones));
    CHECK(mt_module_init_params(m) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "parameter 'd' of module 'bad'") &&
                  strstr(mt_last_error(), "no recorded initialiser"), "%s", mt_last_error());
    CHECK(mt_param_needs_init(d2));
    /* Unsharded: the initialiser allocates the tp-local part; a second one is refused. */
    CHECK_OK(mt_param_init(d, &ones));
    CHECK(mt_param_data(d) != NULL && !mt_param_needs_init(d));
    CHECK(mt_param_init(d, &ones) == MT_ERR_INVALID_ARG);
    CHECK_OK(mt_module_init_params(m));
    CHECK(!mt_param_needs_init(d2));
    CHECK_OK(mt_module_forward(m, NULL));
    mt_module_destroy(m);
}

int main(int argc, char **argv) {
    mt_runtime *rt;
    if (mt_init(&rt, &argc, &argv) != MT_OK) {
        fprintf(stderr, "mt_init: %s\n", mt_last_error());
        return 1;
    }
    int world = mt_runtime_world_size(rt);
    bool tp2 = argc > 1 && strcmp(argv[1], "tp2") == 0;
    mt_mesh *mesh = NULL;
    if (tp2)
        CHECK_OK(mt_mesh_create(rt, 2, (int[]){world / 2, 2}, (const char *[]){"dp", "tp"},
                                &mesh));
    else
        CHECK_OK(mt_mesh_create(rt, 1, (int[]){world}, (const char *[]){"dp"}, &mesh));
    mt_device *dev = mt_runtime_device(rt);
    int tp_rank = tp2 ? mt_mesh_coord(mesh, 1) : 0;
    float **whole = whole_values(mesh, dev);
    check_whole(whole);
    check_sharded(mesh, dev, whole, tp_rank);
    check_bad_input(mesh);
    for (int i = 0; i < N_PARAMS; i++) free(whole[i]);
    free(whole);
    mt_mesh_destroy(mesh);
    char name[64];
    snprintf(name, sizeof name, "test_param_init rank %d", mt_runtime_rank(rt));
    int rc = check_report(name);
    mt_finalize(rt);
    return rc;
}
