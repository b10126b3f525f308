/* The FSDP engine under mtrun, on a toy model whose forward and backward the test controls:
 *
 *   root (r[3]) -> l0 (w[7], b[1]), l1 (m[2x3], child sub (t[5]), not a unit), l2 (s[1])
 *
 * Every rank initialises the same values; forward checks that each parameter it sees equals the
 * original (bf16-rounded with param_dtype bf16); backward adds rank-dependent gradients. After a
 * step each rank's sharded gradients must equal the average over ranks (computed here by looping
 * over the ranks), with padding zero, and memory must be back to the sharded amounts.
 *
 *   test_fsdp_engine [--hsdp] [--lose-rank]
 * --hsdp: a 2 x 2 mesh {rep, shard} (4 ranks), shards replicated over rep.
 * --lose-rank: the last rank leaves after the first step; the others must get an error naming
 *   the unit from their next forward/backward (not hang, not crash).
 * The toy's backward can also fail on purpose in one module (after writing its gradient), or run
 * one child's backward twice in a pass (run_ctx fail_in, twice).
 */
#include "check.h"
#include "core/error.h"
#include "fsdp/fsdp_internal.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NP 6
#define NU 4
enum { U_L0, U_L1, U_L2, U_ROOT };

static const char *p_names[NP] = {"r", "w", "b", "m", "t", "s"};
static const int p_numel[NP] = {3, 7, 1, 6, 5, 1};
/* The params each unit owns, in flat-buffer order (own params first, then children). */
static const int unit_params[NU][3] = {{1, 2, -1}, {3, 4, -1}, {5, -1, -1}, {0, -1, -1}};
static const char *unit_names[NU] = {"l0", "l1", "l2", "root"};

typedef struct run_ctx {
    int rank, world, micro;
    bool bf16;
    float shift; /* added to every original value after an optimizer-like update */
    int bad_values, bad_grads_ptr;
    mt_device *dev;
    size_t max_params_in_forward;
    mt_module *fail_in; /* its backward returns an error after writing its gradient */
    mt_module *twice;   /* its parent runs its backward twice in one pass */
} run_ctx;

typedef struct mod_state {
    run_ctx *ctx;
    int pids[2];
    int npids;
} mod_state;

static float orig(int pid, int j) { return 0.1f * (float)(pid + 1) + 0.013f * (float)j + 1.0f / 3.0f; }
static float grad_of(int rank, int pid, int j, int micro) {
    return 0.5f * (float)((rank + 1) * (pid + 1)) + 0.25f * (float)j + (float)micro;
}

typedef struct toy {
    mt_module *root, *l[3], *sub;
    mt_module *units[NU];
    mt_param *p[NP];
    mod_state st[5];
} toy;

static void check_params(mt_module *m, run_ctx *c) {
    mod_state *s = mt_module_user(m);
    for (int k = 0; k < s->npids; k++) {
        int pid = s->pids[k];
        mt_param *p = mt_module_param(m, (size_t)k);
        float v[8];
        if (mt_param_read_f32(p, v) != MT_OK) {
            c->bad_values++;
            continue;
        }
        for (int j = 0; j < p_numel[pid]; j++) {
            float want = orig(pid, j) + c->shift;
            if (c->bf16) want = mt_bf16_to_f32(mt_f32_to_bf16(want));
            if (v[j] != want) {
                if (c->bad_values++ < 5)
                    fprintf(stderr, "param %s[%d] = %.9g, expected %.9g\n", p_names[pid], j,
                            (double)v[j], (double)want);
            }
        }
    }
}

static mt_status fwd(mt_module *m, void *vctx) {
    run_ctx *c = vctx;
    check_params(m, c);
    for (size_t i = 0; i < mt_module_param_count(m); i++)
        if (mt_param_grad(mt_module_param(m, i))) c->bad_grads_ptr++;
    mt_mem_stats ms;
    mt_device_mem_stats(c->dev, &ms);
    if (ms.current[MT_MEM_PARAMS] > c->max_params_in_forward)
        c->max_params_in_forward = ms.current[MT_MEM_PARAMS];
    for (size_t i = 0; i < mt_module_child_count(m); i++)
        MT_TRY(mt_module_forward(mt_module_child(m, i), c));
    return MT_OK;
}

static mt_status bwd(mt_module *m, void *vctx) {
    run_ctx *c = vctx;
    for (size_t i = mt_module_child_count(m); i-- > 0;) {
        mt_module *child = mt_module_child(m, i);
        MT_TRY(mt_module_backward(child, c));
        if (child == c->twice) MT_TRY(mt_module_backward(child, c));
    }
    check_params(m, c);
    mod_state *s = mt_module_user(m);
    for (int k = 0; k < s->npids; k++) {
        int pid = s->pids[k];
        float *g = mt_param_grad(mt_module_param(m, (size_t)k));
        if (!g) {
            c->bad_grads_ptr++;
            continue;
        }
        for (int j = 0; j < p_numel[pid]; j++) g[j] += grad_of(c->rank, pid, j, c->micro);
    }
    if (m == c->fail_in)
        return mt_error(MT_ERR_INVALID_ARG, "the backward of '%s' fails on purpose",
                        mt_module_name(m));
    return MT_OK;
}

static const mt_module_ops toy_ops = {.forward = fwd, .backward = bwd};

static mt_status add(toy *t, mt_module *m, int pid, int ndim, const int64_t *shape) {
    MT_TRY(mt_module_add_param(m, p_names[pid], ndim, shape, (mt_tp_placement){MT_TP_REPLICATE, 0},
                               &t->p[pid]));
    float *d = mt_param_data(t->p[pid]);
    for (int j = 0; j < p_numel[pid]; j++) d[j] = orig(pid, j);
    mod_state *s = mt_module_user(m);
    s->pids[s->npids++] = pid;
    return MT_OK;
}

static mt_status toy_build(mt_mesh *mesh, run_ctx *c, toy *t) {
    memset(t, 0, sizeof *t);
    const char *names[5] = {"root", "l0", "l1", "l2", "sub"};
    mt_module *mods[5];
    for (int i = 0; i < 5; i++) {
        t->st[i].ctx = c;
        MT_TRY(mt_module_create(mesh, names[i], &toy_ops, &t->st[i], &mods[i]));
    }
    t->root = mods[0];
    t->l[0] = mods[1];
    t->l[1] = mods[2];
    t->l[2] = mods[3];
    t->sub = mods[4];
    for (int i = 1; i < 4; i++) MT_TRY(mt_module_add_child(t->root, mods[i]));
    MT_TRY(mt_module_add_child(t->l[1], t->sub));
    MT_TRY(add(t, t->root, 0, 1, (int64_t[]){3}));
    MT_TRY(add(t, t->l[0], 1, 1, (int64_t[]){7}));
    MT_TRY(add(t, t->l[0], 2, 1, (int64_t[]){1}));
    MT_TRY(add(t, t->l[1], 3, 2, (int64_t[]){2, 3}));
    MT_TRY(add(t, t->sub, 4, 1, (int64_t[]){5}));
    MT_TRY(add(t, t->l[2], 5, 1, (int64_t[]){1}));
    t->units[U_L0] = t->l[0];
    t->units[U_L1] = t->l[1];
    t->units[U_L2] = t->l[2];
    t->units[U_ROOT] = t->root;
    return MT_OK;
}

static mt_status toy_shard(toy *t, const mt_fsdp_options *o) {
    for (int i = 0; i < 3; i++) MT_TRY(mt_fsdp_shard(t->l[i], o));
    return mt_fsdp_shard(t->root, o);
}

static size_t unit_total(int u) {
    size_t n = 0;
    for (int k = 0; k < 3 && unit_params[u][k] >= 0; k++) n += (size_t)p_numel[unit_params[u][k]];
    return n;
}
static size_t unit_shard(int u, int n) { return (unit_total(u) + (size_t)n - 1) / (size_t)n; }

/* The expected value at flat position k of unit u: (pid, j) or -1 in the padding. */
static int locate(int u, size_t k, int *j) {
    for (int i = 0; i < 3 && unit_params[u][i] >= 0; i++) {
        int pid = unit_params[u][i];
        if (k < (size_t)p_numel[pid]) {
            *j = (int)k;
            return pid;
        }
        k -= (size_t)p_numel[pid];
    }
    return -1;
}

/* Checks every unit's shard: master values and the gradient, which must be the average over the
 * world of what the ranks wrote, summed over micro-batches [0, micros), times scale[unit] (each
 * 1 when scale is NULL: a unit whose backward ran k times in a pass has k times the gradient). */
static void check_shards_scaled(toy *t, run_ctx *c, int shard_n, int shard_rank, int micros,
                                const float *scale, float tol, const char *label) {
    mt_fsdp_shard_view *v;
    size_t n;
    CHECK_OK(mt_fsdp_collect_shards(t->root, &v, &n));
    if (n != NU) {
        CHECK_MSG(n == NU, "%s: %zu shard views", label, n);
        return;
    }
    for (int u = 0; u < NU; u++) {
        CHECK_MSG(strcmp(v[u].unit_name, unit_names[u]) == 0, "%s: view %d is '%s'", label, u,
                  v[u].unit_name);
        size_t S = unit_shard(u, shard_n), lo = (size_t)shard_rank * S;
        CHECK_MSG(v[u].n == S, "%s: unit %s shard %zu, expected %zu", label, unit_names[u], v[u].n, S);
        if (v[u].n != S) continue;
        size_t real = 0, in_ranges = 0;
        for (size_t k = 0; k < S; k++) {
            int j, pid = locate(u, lo + k, &j);
            float want_p = pid < 0 ? 0.0f : orig(pid, j) + c->shift;
            double want_g = 0;
            if (pid >= 0) {
                real++;
                for (int m = 0; m < micros; m++) {
                    double sum = 0;
                    for (int r = 0; r < c->world; r++) sum += grad_of(r, pid, j, m);
                    want_g += sum / c->world;
                }
                if (scale) want_g *= scale[u];
            }
            CHECK_MSG(v[u].param[k] == want_p, "%s: unit %s master[%zu] %g, expected %g", label,
                      unit_names[u], k, (double)v[u].param[k], (double)want_p);
            double err = fabs(v[u].grad[k] - want_g);
            CHECK_MSG(err <= tol * fabs(want_g) + 1e-6, "%s: unit %s grad[%zu] (flat %zu) %.7g, "
                      "expected %.7g", label, unit_names[u], k, lo + k, (double)v[u].grad[k], want_g);
        }
        for (size_t r = 0; r < v[u].n_ranges; r++) {
            CHECK(v[u].ranges[r].begin < v[u].ranges[r].end && v[u].ranges[r].end <= S);
            CHECK(v[u].ranges[r].tp_replicated);
            in_ranges += v[u].ranges[r].end - v[u].ranges[r].begin;
        }
        CHECK_MSG(in_ranges == real, "%s: unit %s ranges cover %zu elements, expected %zu", label,
                  unit_names[u], in_ranges, real);
    }
    free(v);
}

static void check_shards(toy *t, run_ctx *c, int shard_n, int shard_rank, int micros, float tol,
                         const char *label) {
    check_shards_scaled(t, c, shard_n, shard_rank, micros, NULL, tol, label);
}

static mt_status step(toy *t, run_ctx *c, int micro) {
    c->micro = micro;
    MT_TRY(mt_module_forward(t->root, c));
    return mt_module_backward(t->root, c);
}

static size_t cur(mt_device *d, mt_mem_category k) {
    mt_mem_stats s;
    mt_device_mem_stats(d, &s);
    return k == MT_MEM_CATEGORY_COUNT ? s.total_current : s.current[k];
}
static size_t peak(mt_device *d, mt_mem_category k) {
    mt_mem_stats s;
    mt_device_mem_stats(d, &s);
    return s.peak[k];
}

/* Bytes of the sharded state and of each unit's full buffer for n shard ranks. */
static size_t shard_bytes(int n, size_t es) {
    size_t b = 0;
    for (int u = 0; u < NU; u++) b += unit_shard(u, n) * es;
    return b;
}
static size_t full_bytes(int u, int n, size_t es) { return unit_shard(u, n) * (size_t)n * es; }
/* The params bytes of u while gathered: none at one rank with f32 parameters, which unshard into
 * the master shard itself (mt_fsdp_gather_aliases). */
static size_t gathered_bytes(int u, int n, size_t es) {
    return n == 1 && es == 4 ? 0 : full_bytes(u, n, es);
}

typedef struct env {
    mt_mesh *mesh;
    const char *shard_dim, *replicate_dim;
    int shard_n, shard_rank;
    run_ctx *c;
} env;

/* The default options on the test's mesh (HSDP when it has a replicate dimension). */
static mt_fsdp_options env_options(const env *e) {
    mt_fsdp_options o = mt_fsdp_defaults(e->mesh, e->shard_dim);
    o.replicate_dim = e->replicate_dim;
    return o;
}

/* The setup of most cases: the toy on the test's mesh, sharded layers first, then the root, with
 * o (NULL: env_options). */
static void toy_setup(const env *e, toy *t, const mt_fsdp_options *o) {
    mt_fsdp_options defaults = env_options(e);
    CHECK_OK(toy_build(e->mesh, e->c, t));
    CHECK_OK(toy_shard(t, o ? o : &defaults));
}

/* Adds 1 to every master value this rank holds (as an optimizer step would) and tells the engine,
 * so that the next gather must show originals + 1. */
static void shift_masters(toy *t) {
    mt_fsdp_shard_view *v;
    size_t nv;
    CHECK_OK(mt_fsdp_collect_shards(t->root, &v, &nv));
    for (size_t u = 0; u < nv; u++)
        for (size_t r = 0; r < v[u].n_ranges; r++)
            for (size_t k = v[u].ranges[r].begin; k < v[u].ranges[r].end; k++) v[u].param[k] += 1.0f;
    free(v);
    CHECK_OK(mt_fsdp_shards_updated(t->root));
}

/* Records a failure when forward or backward saw parameter values other than expected since the
 * last call (check_params counts them in c->bad_values), then starts the count again. */
static void check_values(run_ctx *c, const char *label) {
    CHECK_MSG(c->bad_values == 0, "%s: %d parameter values differ from the expected ones", label,
              c->bad_values);
    c->bad_values = 0;
}

/* f32, default options: values, gradients, recorded order, prefetch counters, memory. */
static void test_basic(env *e) {
    run_ctx *c = e->c;
    mt_device *d = c->dev;
    size_t base_p = cur(d, MT_MEM_PARAMS), base_g = cur(d, MT_MEM_GRADS);
    toy t;
    CHECK_OK(toy_build(e->mesh, c, &t));
    size_t all = 0;
    for (int i = 0; i < NP; i++) all += (size_t)p_numel[i] * 4;
    CHECK_MSG(cur(d, MT_MEM_PARAMS) - base_p == all, "params before sharding %zu, expected %zu",
              cur(d, MT_MEM_PARAMS) - base_p, all);
    mt_fsdp_options o = env_options(e);
    CHECK_OK(toy_shard(&t, &o));
    int n = e->shard_n;
    size_t sh = shard_bytes(n, 4);
    CHECK_MSG(cur(d, MT_MEM_PARAMS) - base_p == sh, "params after sharding %zu, expected %zu",
              cur(d, MT_MEM_PARAMS) - base_p, sh);
    CHECK(mt_param_data(t.p[1]) == NULL);
    CHECK(mt_param_dtype(t.p[1]) == MT_F32);
    float tmp[8];
    CHECK(mt_param_read_f32(t.p[1], tmp) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "'w'") != NULL, "message: %s", mt_last_error());

    CHECK_OK(mt_module_forward(t.root, c));
    /* The root keeps its parameters after forward; the layers are resharded. */
    size_t after_fwd = cur(d, MT_MEM_PARAMS) - base_p;
    CHECK_MSG(after_fwd == sh + gathered_bytes(U_ROOT, n, 4), "params after forward %zu, "
              "expected %zu", after_fwd, sh + gathered_bytes(U_ROOT, n, 4));
    CHECK_OK(mt_module_backward(t.root, c));
    check_shards(&t, c, n, e->shard_rank, 1, 1e-6f, "basic step 1");
    CHECK_MSG(cur(d, MT_MEM_PARAMS) - base_p == sh, "params after step %zu, expected %zu",
              cur(d, MT_MEM_PARAMS) - base_p, sh);
    CHECK_MSG(cur(d, MT_MEM_GRADS) - base_g == shard_bytes(n, 4), "grads after step %zu",
              cur(d, MT_MEM_GRADS) - base_g);
    size_t comm1 = cur(d, MT_MEM_COMM);

    /* The recorded order, then the second step prefetches along it. */
    mt_module *ord[8];
    size_t no;
    CHECK_OK(mt_fsdp_debug_order(t.root, false, ord, 8, &no));
    CHECK_MSG(no == 4 && ord[0] == t.root && ord[1] == t.l[0] && ord[2] == t.l[1] &&
              ord[3] == t.l[2], "forward order: %zu units", no);
    CHECK_OK(mt_fsdp_debug_order(t.root, true, ord, 8, &no));
    CHECK_MSG(no == 4 && ord[0] == t.root && ord[1] == t.l[2] && ord[2] == t.l[1] &&
              ord[3] == t.l[0], "backward order: %zu units", no);

    CHECK_OK(mt_zero_grad(t.root));
    mt_device_reset_peaks(d);
    CHECK_OK(step(&t, c, 0));
    check_shards(&t, c, n, e->shard_rank, 1, 1e-6f, "basic step 2");
    size_t pair = gathered_bytes(U_L0, n, 4) + gathered_bytes(U_L1, n, 4);
    size_t pair2 = gathered_bytes(U_L1, n, 4) + gathered_bytes(U_L2, n, 4);
    size_t want_peak = base_p + sh + gathered_bytes(U_ROOT, n, 4) + (pair > pair2 ? pair : pair2);
    CHECK_MSG(peak(d, MT_MEM_PARAMS) == want_peak, "peak params with prefetch %zu, expected %zu",
              peak(d, MT_MEM_PARAMS), want_peak);
    CHECK_MSG(cur(d, MT_MEM_COMM) == comm1, "comm after step 2 %zu, after step 1 %zu",
              cur(d, MT_MEM_COMM), comm1);
    mt_fsdp_debug dbg;
    for (int u = 0; u < NU; u++) {
        CHECK_OK(mt_fsdp_debug_get(t.units[u], &dbg));
        long want_ag = u == U_ROOT ? 2 : 4, want_pf = u == U_ROOT ? 0 : 2;
        CHECK_MSG(dbg.all_gathers == want_ag, "unit %s: %ld all-gathers, expected %ld",
                  unit_names[u], dbg.all_gathers, want_ag);
        CHECK_MSG(dbg.prefetches == want_pf, "unit %s: %ld prefetches, expected %ld",
                  unit_names[u], dbg.prefetches, want_pf);
        CHECK_MSG(dbg.reduce_scatters == 2, "unit %s: %ld reduce-scatters", unit_names[u],
                  dbg.reduce_scatters);
    }
    CHECK_OK(mt_fsdp_debug_get(t.root, &dbg));
    /* One rank: the gradients land in the shards in place, no reduce-scatter is in flight. */
    CHECK_MSG(dbg.max_outstanding_rs == (n == 1 ? 0 : 1), "at most one reduce-scatter in flight: "
              "%d", dbg.max_outstanding_rs);

    /* Explicit prefetch: the root starts every layer's gather at once. */
    mt_module *layers[3] = {t.l[0], t.l[1], t.l[2]};
    CHECK_OK(mt_fsdp_set_forward_prefetch(t.root, layers, 3));
    CHECK_OK(mt_zero_grad(t.root));
    mt_device_reset_peaks(d);
    CHECK_OK(mt_module_forward(t.root, c));
    size_t every = base_p + sh;
    for (int u = 0; u < NU; u++) every += gathered_bytes(u, n, 4);
    CHECK_MSG(peak(d, MT_MEM_PARAMS) == every, "peak params with explicit prefetch %zu, expected "
              "%zu", peak(d, MT_MEM_PARAMS), every);
    CHECK_OK(mt_module_backward(t.root, c));
    check_shards(&t, c, n, e->shard_rank, 1, 1e-6f, "explicit prefetch");

    check_values(c, "basic");
    /* An update of the master shards shows in the next gather. */
    shift_masters(&t);
    c->shift = 1.0f;
    CHECK_OK(mt_module_forward(t.root, c));
    CHECK_OK(mt_module_backward(t.root, c));
    check_values(c, "basic, after the update");
    c->shift = 0;
    mt_module_destroy(t.root);
    CHECK_MSG(cur(d, MT_MEM_PARAMS) == base_p && cur(d, MT_MEM_GRADS) == base_g,
              "destroy leaves params %zu grads %zu", cur(d, MT_MEM_PARAMS) - base_p,
              cur(d, MT_MEM_GRADS) - base_g);
}

/* Prefetch off: one layer at a time beside the root. */
static void test_no_prefetch(env *e) {
    run_ctx *c = e->c;
    mt_device *d = c->dev;
    size_t base_p = cur(d, MT_MEM_PARAMS);
    toy t;
    toy_setup(e, &t, NULL);
    CHECK_OK(mt_fsdp_set_prefetch(t.root, false));
    int n = e->shard_n;
    for (int s = 0; s < 2; s++) {
        CHECK_OK(mt_zero_grad(t.root));
        mt_device_reset_peaks(d);
        CHECK_OK(step(&t, c, 0));
        check_shards(&t, c, n, e->shard_rank, 1, 1e-6f, "no prefetch");
    }
    size_t big = 0;
    for (int u = 0; u < 3; u++)
        if (gathered_bytes(u, n, 4) > big) big = gathered_bytes(u, n, 4);
    size_t want = base_p + shard_bytes(n, 4) + gathered_bytes(U_ROOT, n, 4) + big;
    CHECK_MSG(peak(d, MT_MEM_PARAMS) == want, "peak params without prefetch %zu, expected %zu",
              peak(d, MT_MEM_PARAMS), want);
    for (int u = 0; u < NU; u++) {
        mt_fsdp_debug dbg;
        CHECK_OK(mt_fsdp_debug_get(t.units[u], &dbg));
        CHECK_MSG(dbg.prefetches == 0, "unit %s: %ld prefetches with prefetch off", unit_names[u],
                  dbg.prefetches);
    }
    check_values(c, "no prefetch");
    mt_module_destroy(t.root);
}

/* reshard_after_forward 0: every unit stays gathered until backward; 1: even the root frees. */
static void test_reshard(env *e, int raf) {
    run_ctx *c = e->c;
    mt_device *d = c->dev;
    size_t base_p = cur(d, MT_MEM_PARAMS);
    mt_fsdp_options o = env_options(e);
    o.reshard_after_forward = raf;
    toy t;
    toy_setup(e, &t, &o);
    int n = e->shard_n;
    for (int s = 0; s < 2; s++) {
        CHECK_OK(mt_zero_grad(t.root));
        c->micro = 0;
        CHECK_OK(mt_module_forward(t.root, c));
        size_t want = shard_bytes(n, 4);
        if (!raf)
            for (int u = 0; u < NU; u++) want += gathered_bytes(u, n, 4);
        CHECK_MSG(cur(d, MT_MEM_PARAMS) - base_p == want, "reshard_after_forward=%d: params after "
                  "forward %zu, expected %zu", raf, cur(d, MT_MEM_PARAMS) - base_p, want);
        CHECK_OK(mt_module_backward(t.root, c));
        check_shards(&t, c, n, e->shard_rank, 1, 1e-6f, raf ? "reshard 1" : "reshard 0");
        CHECK(cur(d, MT_MEM_PARAMS) - base_p == shard_bytes(n, 4));
    }
    check_values(c, raf ? "reshard 1" : "reshard 0");
    mt_module_destroy(t.root);
}

/* Gradient accumulation: 3 backwards without sync, then one with: the sum of the averages. */
static void test_accumulation(env *e) {
    run_ctx *c = e->c;
    mt_device *d = c->dev;
    size_t base_g = cur(d, MT_MEM_GRADS);
    toy t;
    toy_setup(e, &t, NULL);
    int n = e->shard_n;
    CHECK_OK(mt_fsdp_set_requires_gradient_sync(t.root, false));
    for (int m = 0; m < 3; m++) {
        CHECK_OK(step(&t, c, m));
        size_t want = shard_bytes(n, 4);
        for (int u = 0; u < NU; u++) want += full_bytes(u, n, 4);
        CHECK_MSG(cur(d, MT_MEM_GRADS) - base_g == want, "grads while accumulating %zu, expected "
                  "%zu", cur(d, MT_MEM_GRADS) - base_g, want);
    }
    check_shards(&t, c, n, e->shard_rank, 0, 1e-6f, "no sync yet");
    CHECK_OK(mt_fsdp_set_requires_gradient_sync(t.root, true));
    CHECK_OK(step(&t, c, 3));
    check_shards(&t, c, n, e->shard_rank, 4, 1e-6f, "accumulated");
    CHECK_MSG(cur(d, MT_MEM_GRADS) - base_g == shard_bytes(n, 4), "grads after sync %zu",
              cur(d, MT_MEM_GRADS) - base_g);
    check_values(c, "accumulation");
    mt_module_destroy(t.root);
}

/* bf16 parameters: gathered values are the bf16-rounded masters; memory per category. */
static void test_bf16(env *e, mt_dtype reduce) {
    run_ctx *c = e->c;
    mt_device *d = c->dev;
    size_t base_p = cur(d, MT_MEM_PARAMS), base_o = cur(d, MT_MEM_OPTIMIZER);
    mt_fsdp_options o = env_options(e);
    o.param_dtype = MT_BF16;
    o.reduce_dtype = reduce;
    toy t;
    toy_setup(e, &t, &o);
    int n = e->shard_n;
    CHECK(mt_param_dtype(t.p[0]) == MT_BF16);
    CHECK_MSG(cur(d, MT_MEM_PARAMS) - base_p == shard_bytes(n, 2), "bf16 shard %zu, expected %zu",
              cur(d, MT_MEM_PARAMS) - base_p, shard_bytes(n, 2));
    CHECK_MSG(cur(d, MT_MEM_OPTIMIZER) - base_o == shard_bytes(n, 4), "f32 masters %zu",
              cur(d, MT_MEM_OPTIMIZER) - base_o);
    c->bf16 = true;
    for (int s = 0; s < 2; s++) {
        CHECK_OK(mt_zero_grad(t.root));
        mt_device_reset_peaks(d);
        CHECK_OK(step(&t, c, 0));
        check_shards(&t, c, n, e->shard_rank, 1, reduce == MT_BF16 ? 1.6e-2f : 1e-6f, "bf16");
    }
    check_values(c, "bf16");
    size_t pair = full_bytes(U_L0, n, 2) + full_bytes(U_L1, n, 2);
    size_t pair2 = full_bytes(U_L1, n, 2) + full_bytes(U_L2, n, 2);
    size_t want = base_p + shard_bytes(n, 2) + full_bytes(U_ROOT, n, 2) + (pair > pair2 ? pair : pair2);
    CHECK_MSG(peak(d, MT_MEM_PARAMS) == want, "bf16 peak params %zu, expected %zu",
              peak(d, MT_MEM_PARAMS), want);
    CHECK(cur(d, MT_MEM_PARAMS) - base_p == shard_bytes(n, 2));
    /* An update of the masters reaches the bf16 copies. */
    shift_masters(&t);
    c->shift = 1.0f;
    CHECK_OK(mt_module_forward(t.root, c));
    CHECK_OK(mt_module_backward(t.root, c));
    check_values(c, "bf16, after the update");
    c->shift = 0;
    c->bf16 = false;
    mt_module_destroy(t.root);
}

/* A wrapper with no parameters of its own above the root: a unit of zero elements. */
static void test_empty_unit(env *e) {
    run_ctx *c = e->c;
    mt_device *d = c->dev;
    size_t base_p = cur(d, MT_MEM_PARAMS), base_g = cur(d, MT_MEM_GRADS);
    toy t;
    CHECK_OK(toy_build(e->mesh, c, &t));
    mt_module *wrap;
    CHECK_OK(mt_module_create(e->mesh, "wrap", NULL, NULL, &wrap));
    CHECK_OK(mt_module_add_child(wrap, t.root));
    mt_fsdp_options o = env_options(e);
    CHECK_OK(toy_shard(&t, &o));
    CHECK_OK(mt_fsdp_shard(wrap, &o));
    for (int s = 0; s < 2; s++) {
        c->micro = 0;
        CHECK_OK(mt_zero_grad(wrap));
        CHECK_OK(mt_module_forward(wrap, c));
        CHECK_OK(mt_module_backward(wrap, c));
    }
    mt_fsdp_shard_view *v;
    size_t nv;
    CHECK_OK(mt_fsdp_collect_shards(wrap, &v, &nv));
    CHECK(nv == NU + 1 && v[NU].n == 0 && v[NU].n_ranges == 0 && strcmp(v[NU].unit_name, "wrap") == 0);
    free(v);
    check_shards(&t, c, e->shard_n, e->shard_rank, 1, 1e-6f, "under an empty unit");
    CHECK(cur(d, MT_MEM_PARAMS) - base_p == shard_bytes(e->shard_n, 4));
    CHECK(cur(d, MT_MEM_GRADS) - base_g == shard_bytes(e->shard_n, 4));
    mt_module_destroy(wrap);
}

/* l1's backward fails on every rank after writing part of its gradient (l2 reduced, l0 never
 * ran): the error is returned as is, and after mt_zero_grad a retry gives exactly one step's
 * gradients. The partial gradient must not stay in l1's full buffer (it gave 2x). */
static void test_failed_backward(env *e) {
    run_ctx *c = e->c;
    mt_device *d = c->dev;
    size_t base_g = cur(d, MT_MEM_GRADS);
    toy t;
    toy_setup(e, &t, NULL);
    int n = e->shard_n;
    for (int s = 0; s < 2; s++) { /* the first pass records the order, the second uses it */
        c->fail_in = t.l[1];
        c->micro = 0;
        CHECK_OK(mt_module_forward(t.root, c));
        mt_status st = mt_module_backward(t.root, c);
        CHECK_MSG(st == MT_ERR_INVALID_ARG && strstr(mt_last_error(), "'l1' fails on purpose"),
                  "failed backward %d: %s: %s", s, mt_status_str(st), mt_last_error());
        c->fail_in = NULL;
        CHECK_MSG(cur(d, MT_MEM_GRADS) - base_g == shard_bytes(n, 4), "grads after a failed "
                  "backward %zu, expected the shards' %zu", cur(d, MT_MEM_GRADS) - base_g,
                  shard_bytes(n, 4));
        CHECK_OK(mt_zero_grad(t.root));
        CHECK_OK(step(&t, c, 0));
        check_shards(&t, c, n, e->shard_rank, 1, 1e-6f, "retry after a failed backward");
        CHECK_OK(mt_zero_grad(t.root));
    }
    check_values(c, "failed backward");
    mt_module_destroy(t.root);
}

/* l1 (a unit, with its non-unit child sub) runs twice in one backward: its gradient is twice
 * one pass's, the others' once, and no error. The second run must not write l1's full gradient
 * while the reduce-scatter of the first still reads it. */
static void test_unit_twice(env *e) {
    run_ctx *c = e->c;
    mt_device *d = c->dev;
    size_t base_g = cur(d, MT_MEM_GRADS);
    toy t;
    toy_setup(e, &t, NULL);
    int n = e->shard_n;
    const float scale[NU] = {[U_L0] = 1, [U_L1] = 2, [U_L2] = 1, [U_ROOT] = 1};
    c->twice = t.l[1];
    for (int s = 0; s < 2; s++) { /* recording, then prefetching along the recorded order */
        CHECK_OK(mt_zero_grad(t.root));
        CHECK_OK(step(&t, c, 0));
        check_shards_scaled(&t, c, n, e->shard_rank, 1, scale, 1e-6f, "l1 twice in a pass");
        CHECK_MSG(cur(d, MT_MEM_GRADS) - base_g == shard_bytes(n, 4), "grads after the pass %zu",
                  cur(d, MT_MEM_GRADS) - base_g);
    }
    c->twice = NULL;
    /* Once again: back to one pass's gradient. */
    CHECK_OK(mt_zero_grad(t.root));
    CHECK_OK(step(&t, c, 0));
    check_shards(&t, c, n, e->shard_rank, 1, 1e-6f, "l1 once after twice");
    check_values(c, "unit twice");
    mt_module_destroy(t.root);
}

/* Misuse is refused with a message naming the module or parameter. */
static void test_errors(env *e) {
    run_ctx *c = e->c;
    toy t;
    CHECK_OK(toy_build(e->mesh, c, &t));
    mt_fsdp_options o = env_options(e);
    CHECK_OK(mt_fsdp_shard(t.root, &o));
    CHECK(mt_fsdp_shard(t.l[0], &o) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "layers first") != NULL, "message: %s", mt_last_error());
    CHECK(mt_fsdp_shard(t.root, &o) == MT_ERR_INVALID_ARG);
    mt_param *p;
    CHECK(mt_module_add_param(t.l[0], "late", 1, (int64_t[]){2},
                              (mt_tp_placement){MT_TP_REPLICATE, 0}, &p) == MT_ERR_INVALID_ARG);
    mt_fsdp_options bad = o;
    bad.shard_dim = "nope";
    toy t2;
    CHECK_OK(toy_build(e->mesh, c, &t2));
    CHECK(mt_fsdp_shard(t2.l[0], &bad) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "nope") != NULL, "message: %s", mt_last_error());
    CHECK(mt_zero_grad(t2.root) == MT_ERR_INVALID_ARG);
    /* Root alone owns everything: still one correct step. */
    CHECK_OK(step(&t, c, 0));
    mt_fsdp_shard_view *v;
    size_t nv;
    CHECK_OK(mt_fsdp_collect_shards(t.root, &v, &nv));
    size_t total = 0;
    for (int i = 0; i < NP; i++) total += (size_t)p_numel[i];
    CHECK(nv == 1 && v[0].n == (total + (size_t)e->shard_n - 1) / (size_t)e->shard_n);
    free(v);
    mt_module_destroy(t.root);
    mt_module_destroy(t2.root);
}

/* tp placement: local shapes on a {dp, tp} mesh and a non-divisible dimension refused. */
static void test_tp_params(mt_runtime *rt) {
    int w = mt_runtime_world_size(rt);
    if (w % 2) return;
    mt_mesh *mesh;
    CHECK_OK(mt_mesh_create(rt, 2, (int[]){w / 2, 2}, (const char *[]){"dp", "tp"}, &mesh));
    mt_module *m;
    CHECK_OK(mt_module_create(mesh, "tpmod", NULL, NULL, &m));
    mt_param *p;
    CHECK_OK(mt_module_add_param(m, "col", 2, (int64_t[]){4, 3}, (mt_tp_placement){MT_TP_SHARD, 0},
                                 &p));
    CHECK(mt_param_local_dim(p, 0) == 2 && mt_param_local_dim(p, 1) == 3 && mt_param_numel(p) == 6);
    CHECK(mt_param_global_dim(p, 0) == 4);
    CHECK(mt_module_add_param(m, "odd", 1, (int64_t[]){3}, (mt_tp_placement){MT_TP_SHARD, 0},
                              &p) == MT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(mt_last_error(), "'odd'") && strstr(mt_last_error(), "tpmod"), "message: %s",
              mt_last_error());
    mt_fsdp_options o = mt_fsdp_defaults(mesh, "dp");
    CHECK_OK(mt_fsdp_shard(m, &o));
    mt_group *sg, *rg, *tg;
    int tr;
    CHECK_OK(mt_fsdp_groups(m, &sg, &rg, &tg, &tr));
    CHECK(mt_group_size(sg) == w / 2 && rg == NULL && tg && mt_group_size(tg) == 2 &&
          tr == mt_runtime_rank(rt) % 2);
    mt_fsdp_shard_view *v;
    size_t nv;
    CHECK_OK(mt_fsdp_collect_shards(m, &v, &nv));
    CHECK(nv == 1 && v[0].n_ranges <= 1 && (v[0].n_ranges == 0 || !v[0].ranges[0].tp_replicated));
    free(v);
    mt_module_destroy(m);
    mt_mesh_destroy(mesh);
}

/* The last rank leaves; the others' next step must fail with the unit named. */
static int lose_rank(env *e, mt_runtime *rt) {
    run_ctx *c = e->c;
    toy t;
    toy_setup(e, &t, NULL);
    CHECK_OK(step(&t, c, 0));
    check_values(c, "lose-rank, the first step");
    CHECK_OK(mt_barrier(mt_runtime_world(rt), NULL));
    if (c->rank == c->world - 1) {
        printf("rank %d leaves\n", c->rank);
        fflush(stdout);
        _exit(0);
    }
    mt_status st = step(&t, c, 0);
    CHECK_MSG(st != MT_OK, "a step with a lost rank succeeded");
    CHECK_MSG(strstr(mt_last_error(), "unit '") != NULL, "message: %s", mt_last_error());
    printf("rank %d: expected error: %s: %s\n", c->rank, mt_status_str(st), mt_last_error());
    /* Later steps fail at once instead of issuing collectives the peers will not match. */
    st = step(&t, c, 0);
    CHECK(st != MT_OK);
    mt_module_destroy(t.root);
    fflush(stdout);
    int rc = check_report("test_fsdp_engine lose-rank");
    fflush(stdout);
    _exit(rc); /* the runtime's teardown would wait for the lost peer */
}

int main(int argc, char **argv) {
    bool hsdp = false, lose = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--hsdp") == 0) hsdp = true;
        else if (strcmp(argv[i], "--lose-rank") == 0) lose = true;
        else {
            fprintf(stderr, "usage: test_fsdp_engine [--hsdp] [--lose-rank]\n");
            return 2;
        }
    }
    mt_runtime *rt;
    mt_status st = mt_init(&rt, &argc, &argv);
    if (st != MT_OK) {
        fprintf(stderr, "mt_init: %s\n", mt_last_error());
        return 1;
    }
    run_ctx c = {0};
    c.rank = mt_runtime_rank(rt);
    c.world = mt_runtime_world_size(rt);
    c.dev = mt_runtime_device(rt);
    env e = {0};
    e.c = &c;
    mt_mesh *mesh = NULL;
    if (hsdp) {
        if (c.world != 4) {
            fprintf(stderr, "--hsdp needs 4 ranks\n");
            return 2;
        }
        CHECK_OK(mt_mesh_create(rt, 2, (int[]){2, 2}, (const char *[]){"rep", "shard"}, &mesh));
        e.shard_dim = "shard";
        e.replicate_dim = "rep";
        e.shard_n = 2;
        e.shard_rank = mt_mesh_coord(mesh, 1);
    } else {
        CHECK_OK(mt_mesh_create(rt, 1, (int[]){c.world}, (const char *[]){"dp"}, &mesh));
        e.shard_dim = "dp";
        e.shard_n = c.world;
        e.shard_rank = c.rank;
    }
    e.mesh = mesh;
    if (lose) return lose_rank(&e, rt);
    test_basic(&e);
    test_no_prefetch(&e);
    test_reshard(&e, 0);
    test_reshard(&e, 1);
    test_accumulation(&e);
    test_bf16(&e, MT_BF16);
    test_bf16(&e, MT_F32);
    test_errors(&e);
    test_empty_unit(&e);
    test_failed_backward(&e);
    test_unit_twice(&e);
    CHECK_MSG(c.bad_values == 0, "%d parameter values differed from the originals", c.bad_values);
    CHECK_MSG(c.bad_grads_ptr == 0, "%d gradient pointers wrong (NULL in backward or set in "
              "forward)", c.bad_grads_ptr);
    if (!hsdp) test_tp_params(rt);
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    return check_report(hsdp ? "test_fsdp_engine hsdp" : "test_fsdp_engine");
}
