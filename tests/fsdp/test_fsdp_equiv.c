/* FSDP equivalence and determinism: one training program, run through mtrun with any rank count,
 * and a comparer for what two runs wrote.
 *
 *   test_fsdp_equiv train --out PREFIX [--steps 10] [--batch 24] [--accum K] [--lr 1e-3]
 *                   [--layers 4 --width 64 --in 32 --out-dim 16] [--bf16] [--no-prefetch]
 *                   [--reshard 0|1] [--hsdp RxS] [--clip MAX] [--expect-clip]
 *                   [--gathers mapped|copied|off]
 *   test_fsdp_equiv compare REF OTHER --rtol TOL [--label TEXT] [--losses-only]
 *
 * train: every rank trains the reference MLP (mlp.h) with AdamW on the same global batch of each
 * step: data-parallel rank r (its world rank; under HSDP the mesh is row-major, so that is
 * replicate * S + shard) takes samples [r B/N, (r+1) B/N). With --accum K the step is K
 * micro-batches of B/K samples each (micro-batch m is samples [m B/K, (m+1) B/K) of the step,
 * split over the ranks the same way), gradient sync off on the first K-1, grad_scale 1/K: the
 * same gradient as one batch of B. Rank 0 writes
 *   PREFIX.loss   "step S loss L norm G clipped C" per step, L the global mean loss (the ranks'
 *                 means weighted by their sample counts), G the global gradient norm before
 *                 clipping, as C99 hex floats so that equal files mean bit-identical values;
 *   PREFIX.params "param NAME COUNT" then COUNT hex floats, every parameter after the last step.
 * Parameters are read from the engine's f32 master shards (fsdp/fsdp_shards.h): each unit's
 * shards are all-gathered over the shard group and the padding (what no range covers) dropped.
 * That reading is itself checked right after sharding: it must give back, bit for bit, the values
 * the parameters had before sharding (read through mt_param_read_f32), in module order.
 *
 * compare: losses and norms per step, |a - b| / max(|b|, 1e-6); parameters per tensor, the
 * norm-wise relative difference ||a - b||_2 / max(||b||_2, 1e-6). Every measure must be <= TOL;
 * the largest of each kind is printed, with the largest element-wise difference for information.
 * Why norm-wise for tensors: two runs that sum the same terms in another order (N ranks) agree to
 * ~1e-7 almost everywhere, but AdamW divides each gradient by its own running magnitude, so an
 * element whose gradient is a near-cancelling sum (or sits on a ReLU kink) can move by up to lr
 * per step in one run and not the other: in practice one or two of 11,472 elements differ by
 * ~1e-5 absolute after 10 steps, while the tensor differs by ~1e-7 norm-wise. A real error (a
 * misplaced shard, a missing or doubled gradient contribution, a wrong average) moves whole rows
 * or at least one element by ~lr per step and shows up as >= 1e-3 norm-wise.
 */
#include "check.h"

#include "fsdp/fsdp_internal.h" /* mt_fsdp_debug_get: the schedule's counters */
#include "fsdp/fsdp_shards.h"
#include "models/mlp_internal.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct train_opts {
    const char *out;
    int steps, batch, accum;
    float lr, clip;
    bool expect_clip, bf16, no_prefetch;
    int reshard; /* -1: default */
    /* --gathers: mapped (some unit's gathers map the ranks' shards, and all of that unit's do),
     * copied (none maps, mapped_gather left on: the fallback), off (mapped_gather false);
     * NULL: no expectation, the default option. */
    const char *gathers;
    int hsdp_r, hsdp_s;
    mt_mlp_config cfg;
} train_opts;

/* What a parameter was before sharding: name, size and f32 values (module order). */
typedef struct param_rec {
    char name[96];
    size_t n;
    float *init;
} param_rec;

typedef struct run {
    const train_opts *o;
    mt_runtime *rt;
    mt_mesh *mesh;
    mt_mlp *mlp;
    mt_adamw *opt;
    mt_group *world, *shard, *replicate;
    int rank, world_size;
    param_rec *params;
    size_t nparams;
} run;

static int fail_(run *r, const char *what) {
    fprintf(stderr, "rank %d: %s failed: %s\n", r ? r->rank : -1, what, mt_last_error());
    return 1;
}
#define TRY(r, call)                                                                               \
    do {                                                                                           \
        if ((call) != MT_OK) return fail_((r), #call);                                             \
    } while (0)

/* ---- parameters before sharding ---------------------------------------------------------- */

static int record_params_of(run *r, mt_module *m, const char *prefix) {
    for (size_t i = 0; i < mt_module_param_count(m); i++) {
        mt_param *p = mt_module_param(m, i);
        param_rec *rec = realloc(r->params, (r->nparams + 1) * sizeof *rec);
        if (!rec) return fail_(r, "realloc");
        r->params = rec;
        rec = &r->params[r->nparams++];
        snprintf(rec->name, sizeof rec->name, "%s.%s", prefix, mt_param_name(p));
        rec->n = mt_param_numel(p);
        rec->init = malloc(rec->n * sizeof(float) + 1);
        if (!rec->init) return fail_(r, "malloc");
        TRY(r, mt_param_read_f32(p, rec->init));
    }
    return 0;
}

/* In the order the engine's shard views come: the layers (sharded first), then the root's own. */
static int record_params(run *r) {
    for (int l = 0; l < r->o->cfg.layers; l++) {
        mt_module *layer = mt_mlp_layer(r->mlp, l);
        if (mt_module_child_count(layer) != 0) {
            fprintf(stderr, "layer %d has children; this test expects flat layers\n", l);
            return 1;
        }
        char prefix[32];
        snprintf(prefix, sizeof prefix, "layer%d", l);
        if (record_params_of(r, layer, prefix)) return 1;
    }
    return record_params_of(r, mt_mlp_root(r->mlp), "root");
}

/* ---- parameters after sharding: the full f32 masters, gathered ---------------------------- */

/* All real parameter elements of every unit in shard-view order, on every rank (*out malloc'd). */
static int gather_params(run *r, float **out, size_t *count) {
    mt_fsdp_shard_view *views = NULL;
    size_t nviews = 0;
    TRY(r, mt_fsdp_collect_shards(mt_mlp_root(r->mlp), &views, &nviews));
    int S = mt_group_size(r->shard);
    size_t total = 0, cap = 0;
    float *all = NULL;
    int rc = 0;
    for (size_t u = 0; u < nviews && !rc; u++) {
        const mt_fsdp_shard_view *v = &views[u];
        float *mine = calloc(2 * v->n + 1, sizeof(float));
        float *full = calloc(2 * v->n * (size_t)S + 1, sizeof(float));
        if (!mine || !full) {
            rc = fail_(r, "calloc");
        } else {
            /* [values | mask]: the mask marks the elements some range covers. */
            memcpy(mine, v->param, v->n * sizeof(float));
            for (size_t k = 0; k < v->n_ranges; k++)
                for (size_t e = v->ranges[k].begin; e < v->ranges[k].end && e < v->n; e++)
                    mine[v->n + e] = 1.0f;
            if (mt_all_gather(r->shard, mine, full, 2 * v->n, MT_F32, NULL) != MT_OK)
                rc = fail_(r, "mt_all_gather of a unit's shards");
        }
        if (!rc && total + v->n * (size_t)S > cap) {
            cap = 2 * (total + v->n * (size_t)S);
            float *grown = realloc(all, cap * sizeof(float));
            if (!grown) rc = fail_(r, "realloc");
            else all = grown;
        }
        for (int s = 0; !rc && s < S; s++) {
            const float *vals = full + (size_t)s * 2 * v->n, *mask = vals + v->n;
            for (size_t e = 0; e < v->n; e++)
                if (mask[e] != 0.0f) all[total++] = vals[e];
        }
        free(mine);
        free(full);
    }
    free(views);
    if (rc) {
        free(all);
        return rc;
    }
    *out = all;
    *count = total;
    return 0;
}

/* Right after sharding the masters must hold exactly the values the parameters were made with. */
static void check_layout(run *r) {
    float *all = NULL;
    size_t count = 0;
    if (gather_params(r, &all, &count)) {
        CHECK_MSG(0, "rank %d: could not gather the parameters after sharding", r->rank);
        return;
    }
    size_t want = 0;
    for (size_t i = 0; i < r->nparams; i++) want += r->params[i].n;
    CHECK_MSG(want == mt_mlp_param_count(r->mlp), "the modules hold %zu parameters, mlp says %zu",
              want, mt_mlp_param_count(r->mlp));
    CHECK_MSG(count == want, "rank %d: the shards hold %zu real elements, the modules %zu",
              r->rank, count, want);
    size_t off = 0;
    for (size_t i = 0; i < r->nparams && count == want; i++) {
        const param_rec *p = &r->params[i];
        size_t bad = 0, first = 0;
        for (size_t e = 0; e < p->n; e++)
            if (memcmp(&all[off + e], &p->init[e], sizeof(float)) != 0 && bad++ == 0) first = e;
        CHECK_MSG(bad == 0,
                  "rank %d: %s: %zu of %zu gathered master values differ from the values before "
                  "sharding (first at %zu: %g, expected %g)",
                  r->rank, p->name, bad, p->n, first, all[off + first], p->init[first]);
        off += p->n;
    }
    free(all);
}

static int write_params(run *r) {
    float *all = NULL;
    size_t count = 0;
    if (gather_params(r, &all, &count)) return 1;
    int rc = 0;
    if (r->rank == 0) {
        char path[1024];
        snprintf(path, sizeof path, "%s.params", r->o->out);
        FILE *f = fopen(path, "w");
        if (!f) {
            perror(path);
            rc = 1;
        } else {
            size_t off = 0;
            for (size_t i = 0; i < r->nparams && off + r->params[i].n <= count; i++) {
                fprintf(f, "param %s %zu\n", r->params[i].name, r->params[i].n);
                for (size_t e = 0; e < r->params[i].n; e++) fprintf(f, "%a\n", all[off + e]);
                off += r->params[i].n;
            }
            if (fclose(f) != 0 || off != count) {
                fprintf(stderr, "%s: incomplete (%zu of %zu values)\n", path, off, count);
                rc = 1;
            }
        }
    }
    free(all);
    return rc;
}

/* HSDP: the replicas of a shard must end bit-identical (the all-reduce over replicate). */
static void check_replicas(run *r) {
    if (!r->replicate) return;
    mt_fsdp_shard_view *views = NULL;
    size_t nviews = 0;
    CHECK_OK(mt_fsdp_collect_shards(mt_mlp_root(r->mlp), &views, &nviews));
    int R = mt_group_size(r->replicate);
    for (size_t u = 0; u < nviews; u++) {
        float *all = malloc(views[u].n * (size_t)R * sizeof(float) + 1);
        if (!all) break;
        CHECK_OK(mt_all_gather(r->replicate, views[u].param, all, views[u].n, MT_F32, NULL));
        for (int i = 1; i < R; i++)
            CHECK_MSG(memcmp(all, all + (size_t)i * views[u].n, views[u].n * sizeof(float)) == 0,
                      "rank %d: unit %s: replica %d's master shard differs from replica 0's",
                      r->rank, views[u].unit_name, i);
        free(all);
    }
    free(views);
}

/* Equal numbers cannot show either whether a gather mapped the shards or copied them. */
static void check_gathers(run *r) {
    const char *want = r->o->gathers;
    if (!want) return;
    long mapped_units = 0;
    mt_fsdp_debug d;
    for (int l = 0; l <= r->o->cfg.layers; l++) {
        mt_module *m = l < r->o->cfg.layers ? mt_mlp_layer(r->mlp, l) : mt_mlp_root(r->mlp);
        if (mt_fsdp_debug_get(m, &d) != MT_OK) {
            CHECK_MSG(0, "rank %d: mt_fsdp_debug_get: %s", r->rank, mt_last_error());
            return;
        }
        if (d.mapped_gathers == 0) continue;
        mapped_units++;
        CHECK_MSG(d.mapped_gathers == d.all_gathers, "rank %d: unit %d mapped %ld of its %ld "
                  "gathers", r->rank, l, d.mapped_gathers, d.all_gathers);
    }
    if (strcmp(want, "mapped") == 0)
        CHECK_MSG(mapped_units > 0, "rank %d: no unit's gather was mapped", r->rank);
    else
        CHECK_MSG(mapped_units == 0, "rank %d: %ld units mapped their gathers (--gathers %s)",
                  r->rank, mapped_units, want);
}

/* What equal numbers cannot show: accumulation that still reduce-scattered every micro-batch, or
 * a prefetch switch that did nothing, give the same values. The schedule's counters can. */
static void check_schedule(run *r) {
    long prefetches = 0;
    mt_fsdp_debug d;
    for (int l = 0; l < r->o->cfg.layers; l++) {
        if (mt_fsdp_debug_get(mt_mlp_layer(r->mlp, l), &d) != MT_OK) {
            CHECK_MSG(0, "rank %d: mt_fsdp_debug_get: %s", r->rank, mt_last_error());
            return;
        }
        CHECK_MSG(d.reduce_scatters == r->o->steps,
                  "rank %d: layer %d: %ld reduce-scatters in %d steps of %d micro-batch(es), "
                  "expected one per step",
                  r->rank, l, d.reduce_scatters, r->o->steps, r->o->accum);
        prefetches += d.prefetches;
    }
    if (r->o->no_prefetch)
        CHECK_MSG(prefetches == 0, "rank %d: %ld prefetches with prefetch off", r->rank, prefetches);
    else if (r->o->cfg.layers > 1)
        CHECK_MSG(prefetches > 0, "rank %d: no unit was ever prefetched", r->rank);
    check_gathers(r);
    if (mt_fsdp_debug_get(mt_mlp_root(r->mlp), &d) == MT_OK)
        CHECK_MSG(d.max_outstanding_rs <= 1, "rank %d: %d reduce-scatters were in flight at once",
                  r->rank, d.max_outstanding_rs);
}

/* ---- training ------------------------------------------------------------------------------ */

static int setup(run *r) {
    const train_opts *o = r->o;
    TRY(r, mt_init(&r->rt, NULL, NULL));
    r->rank = mt_runtime_rank(r->rt);
    r->world_size = mt_runtime_world_size(r->rt);
    r->world = mt_runtime_world(r->rt);
    if ((o->batch / o->accum) % r->world_size != 0) {
        fprintf(stderr, "a micro-batch of %d samples does not split over %d ranks\n",
                o->batch / o->accum, r->world_size);
        return 1;
    }
    mt_fsdp_options fo;
    if (o->hsdp_r) {
        if (o->hsdp_r * o->hsdp_s != r->world_size) {
            fprintf(stderr, "--hsdp %dx%d needs %d ranks, not %d\n", o->hsdp_r, o->hsdp_s,
                    o->hsdp_r * o->hsdp_s, r->world_size);
            return 1;
        }
        const char *names[] = {"dp_replicate", "dp_shard"};
        TRY(r, mt_mesh_create(r->rt, 2, (int[]){o->hsdp_r, o->hsdp_s}, names, &r->mesh));
        fo = mt_fsdp_defaults(r->mesh, "dp_shard");
        fo.replicate_dim = "dp_replicate";
        TRY(r, mt_mesh_group(r->mesh, "dp_shard", &r->shard));
        TRY(r, mt_mesh_group(r->mesh, "dp_replicate", &r->replicate));
    } else {
        const char *names[] = {"dp"};
        TRY(r, mt_mesh_create(r->rt, 1, (int[]){r->world_size}, names, &r->mesh));
        fo = mt_fsdp_defaults(r->mesh, "dp");
        TRY(r, mt_mesh_group(r->mesh, "dp", &r->shard));
    }
    if (o->bf16) fo.param_dtype = MT_BF16;
    fo.reshard_after_forward = o->reshard;
    if (o->gathers && strcmp(o->gathers, "off") == 0) fo.mapped_gather = false;

    TRY(r, mt_mlp_create(r->mesh, &o->cfg, &r->mlp));
    if (record_params(r)) return 1;
    for (int l = 0; l < o->cfg.layers; l++) TRY(r, mt_fsdp_shard(mt_mlp_layer(r->mlp, l), &fo));
    TRY(r, mt_fsdp_shard(mt_mlp_root(r->mlp), &fo));
    if (o->no_prefetch) TRY(r, mt_fsdp_set_prefetch(mt_mlp_root(r->mlp), false));
    check_layout(r);
    mt_adamw_options ao = {.lr = o->lr, .weight_decay = 0.01f};
    TRY(r, mt_adamw_create(mt_mlp_root(r->mlp), &ao, &r->opt));
    return 0;
}

/* One optimizer step; *loss gets the global mean loss, *norm the gradient norm before clipping. */
static int train_step(run *r, long step, float *loss, float *norm, bool *clipped) {
    const train_opts *o = r->o;
    mt_module *root = mt_mlp_root(r->mlp);
    int micro = o->batch / o->accum, local = micro / r->world_size;
    size_t xs = (size_t)local * (size_t)o->cfg.in_dim, ys = (size_t)local * (size_t)o->cfg.out_dim;
    float *x = malloc(xs * sizeof(float) + 1), *y = malloc(ys * sizeof(float) + 1);
    if (!x || !y) {
        free(x);
        free(y);
        return fail_(r, "malloc");
    }
    double weighted = 0;
    int rc = 0;
    for (int m = 0; m < o->accum && !rc; m++) {
        long first = (long)m * micro + (long)r->rank * local;
        mt_mlp_synthetic_batch(&o->cfg, 1234, step, first, local, x, y);
        bool sync = m == o->accum - 1;
        float l = 0;
        if (o->accum > 1 && mt_fsdp_set_requires_gradient_sync(root, sync) != MT_OK)
            rc = fail_(r, "mt_fsdp_set_requires_gradient_sync");
        else if (mt_mlp_forward_backward(r->mlp, x, y, local, 1.0f / (float)o->accum, &l) != MT_OK)
            rc = fail_(r, "mt_mlp_forward_backward");
        weighted += (double)l * local;
    }
    free(x);
    free(y);
    if (rc) return rc;

    float mine = (float)weighted, sum = 0;
    TRY(r, mt_all_reduce(r->world, &mine, &sum, 1, MT_F32, MT_REDUCE_SUM, NULL));
    *loss = sum / (float)o->batch;
    TRY(r, mt_clip_grad_norm(root, o->clip, norm));
    *clipped = o->clip > 0 && *norm > o->clip;
    if (o->clip > 0) {
        float after = 0;
        TRY(r, mt_clip_grad_norm(root, 0, &after));
        float want = *clipped ? o->clip : *norm;
        CHECK_MSG(fabsf(after - want) <= 1e-4f * want,
                  "rank %d step %ld: norm %g after clipping to %g, expected %g", r->rank, step,
                  after, o->clip, want);
    }
    TRY(r, mt_adamw_step(r->opt));
    TRY(r, mt_zero_grad(root));
    return 0;
}

static int train(const train_opts *o) {
    run r = {.o = o, .rank = -1};
    int rc = setup(&r);
    FILE *lf = NULL;
    if (!rc && r.rank == 0) {
        char path[1024];
        snprintf(path, sizeof path, "%s.loss", o->out);
        lf = fopen(path, "w");
        if (!lf) {
            perror(path);
            rc = 1;
        }
    }
    int clipped_steps = 0;
    for (long s = 0; s < o->steps && !rc; s++) {
        float loss = 0, norm = 0;
        bool clipped = false;
        rc = train_step(&r, s, &loss, &norm, &clipped);
        if (rc) break;
        clipped_steps += clipped;
        if (lf) {
            fprintf(lf, "step %ld loss %a norm %a clipped %d\n", s, loss, norm, (int)clipped);
            printf("step %ld loss %.7g norm %.7g%s\n", s, loss, norm, clipped ? " (clipped)" : "");
        }
    }
    if (lf && fclose(lf) != 0) rc = 1;
    if (!rc && o->expect_clip)
        CHECK_MSG(clipped_steps > 0, "clipping to %g never bit in %d steps", o->clip, o->steps);
    if (!rc) {
        check_schedule(&r);
        check_replicas(&r);
        rc = write_params(&r);
    }
    if (!rc && r.rank == 0) {
        char buf[1024];
        printf("memory:\n%s\n", mt_memory_report(mt_runtime_device(r.rt), buf, sizeof buf));
    }
    if (r.opt) mt_adamw_destroy(r.opt);
    if (r.mlp) mt_mlp_destroy(r.mlp);
    if (r.mesh) mt_mesh_destroy(r.mesh);
    if (r.rt) mt_finalize(r.rt);
    for (size_t i = 0; i < r.nparams; i++) free(r.params[i].init);
    free(r.params);
    if (rc) return rc;
    char name[64];
    snprintf(name, sizeof name, "fsdp_equiv rank %d", r.rank);
    return check_report(name);
}

/* ---- comparison ----------------------------------------------------------------------------- */

typedef struct series {
    size_t n, cap;
    double *v;
    char (*label)[112];
} series;

static bool series_push(series *s, double v, const char *label) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        double *nv = realloc(s->v, cap * sizeof *nv);
        if (!nv) return false;
        s->v = nv;
        char(*nl)[112] = realloc(s->label, cap * sizeof *nl);
        if (!nl) return false;
        s->label = nl;
        s->cap = cap;
    }
    s->v[s->n] = v;
    snprintf(s->label[s->n], sizeof s->label[0], "%s", label);
    s->n++;
    return true;
}

static void series_free(series *s) {
    free(s->v);
    free(s->label);
}

/* Reads PREFIX.loss: losses into *loss, norms into *norm (labels "step S"). */
static bool read_losses(const char *prefix, series *loss, series *norm) {
    char path[1024], line[256];
    snprintf(path, sizeof path, "%s.loss", prefix);
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        return false;
    }
    bool ok = true;
    while (ok && fgets(line, sizeof line, f)) {
        long step;
        char l[64], g[64];
        int c;
        if (sscanf(line, "step %ld loss %63s norm %63s clipped %d", &step, l, g, &c) != 4) {
            fprintf(stderr, "%s: malformed line '%s'\n", path, line);
            ok = false;
            break;
        }
        char label[32];
        snprintf(label, sizeof label, "step %ld", step);
        ok = series_push(loss, strtod(l, NULL), label) && series_push(norm, strtod(g, NULL), label);
    }
    fclose(f);
    return ok;
}

/* Reads PREFIX.params into one series per file (labels "NAME[i]") plus tensor boundaries. */
static bool read_params(const char *prefix, series *vals, series *bounds) {
    char path[1024], line[256];
    snprintf(path, sizeof path, "%s.params", prefix);
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        return false;
    }
    bool ok = true;
    char name[96] = "";
    while (ok && fgets(line, sizeof line, f)) {
        size_t n;
        if (sscanf(line, "param %95s %zu", name, &n) == 2) {
            ok = series_push(bounds, (double)vals->n, name);
            continue;
        }
        char *end;
        double v = strtod(line, &end);
        if (end == line || !bounds->n) {
            fprintf(stderr, "%s: malformed line '%s'\n", path, line);
            ok = false;
        } else {
            ok = series_push(vals, v, name);
        }
    }
    fclose(f);
    return ok;
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-6); }

static int compare(const char *ref, const char *other, double rtol, bool losses_only,
                   const char *label) {
    series rl = {0}, rn = {0}, ol = {0}, on = {0}, rv = {0}, rb = {0}, ov = {0}, ob = {0};
    if (!read_losses(ref, &rl, &rn) || !read_losses(other, &ol, &on) ||
        (!losses_only && (!read_params(ref, &rv, &rb) || !read_params(other, &ov, &ob))))
        return 2;
    CHECK_MSG(rl.n == ol.n && rl.n > 0, "%s: %zu steps in %s, %zu in %s", label, rl.n, ref, ol.n,
              other);
    double worst_loss = 0, worst_norm = 0, worst_param = 0, worst_elem = 0;
    const char *where_loss = "-", *where_norm = "-", *where_param = "-", *where_elem = "-";
    for (size_t i = 0; i < rl.n && i < ol.n; i++) {
        double dl = rel(ol.v[i], rl.v[i]), dn = rel(on.v[i], rn.v[i]);
        CHECK_MSG(dl <= rtol, "%s: %s: loss %.9g vs reference %.9g (relative %.3g > %.3g)", label,
                  rl.label[i], ol.v[i], rl.v[i], dl, rtol);
        CHECK_MSG(dn <= rtol, "%s: %s: grad norm %.9g vs reference %.9g (relative %.3g > %.3g)",
                  label, rl.label[i], on.v[i], rn.v[i], dn, rtol);
        if (dl > worst_loss) worst_loss = dl, where_loss = rl.label[i];
        if (dn > worst_norm) worst_norm = dn, where_norm = rl.label[i];
    }
    CHECK_MSG(losses_only || (rv.n == ov.n && rb.n == ob.n && rv.n > 0),
              "%s: %zu parameter values in %zu tensors in %s, %zu in %zu in %s", label, rv.n, rb.n,
              ref, ov.n, ob.n, other);
    for (size_t t = 0; rv.n == ov.n && rb.n == ob.n && t < rb.n; t++) {
        size_t begin = (size_t)rb.v[t], end = t + 1 < rb.n ? (size_t)rb.v[t + 1] : rv.n;
        CHECK_MSG(strcmp(rb.label[t], ob.label[t]) == 0 && (size_t)ob.v[t] == begin,
                  "%s: tensor %zu is %s in %s, %s in %s", label, t, rb.label[t], ref, ob.label[t],
                  other);
        double norm2 = 0, diff2 = 0, diff = 0;
        size_t at = begin;
        for (size_t i = begin; i < end; i++) {
            double e = ov.v[i] - rv.v[i];
            norm2 += rv.v[i] * rv.v[i];
            diff2 += e * e;
            if (fabs(e) > diff) diff = fabs(e), at = i;
        }
        double d = sqrt(diff2) / fmax(sqrt(norm2), 1e-6);
        CHECK_MSG(d <= rtol,
                  "%s: %s: ||diff|| %.3g, ||reference|| %.3g: relative %.3g > %.3g (largest "
                  "|diff| %.3g at element %zu: %.9g vs %.9g)",
                  label, rb.label[t], sqrt(diff2), sqrt(norm2), d, rtol, diff, at - begin,
                  ov.v[at], rv.v[at]);
        if (d > worst_param) worst_param = d, where_param = rb.label[t];
        if (diff > worst_elem) worst_elem = diff, where_elem = rb.label[t];
    }
    printf("%s: %zu steps, %zu parameters in %zu tensors; worst relative differences: loss %.3g "
           "(%s), grad norm %.3g (%s), parameters %.3g norm-wise (%s); tolerance %.3g; largest "
           "element difference %.3g (%s)\n",
           label, rl.n, rv.n, rb.n, worst_loss, where_loss, worst_norm, where_norm, worst_param,
           where_param, rtol, worst_elem, where_elem);
    series_free(&rl), series_free(&rn), series_free(&ol), series_free(&on);
    series_free(&rv), series_free(&rb), series_free(&ov), series_free(&ob);
    return check_report(label);
}

/* ---- command line ----------------------------------------------------------------------------- */

static int usage(void) {
    fprintf(stderr, "usage: test_fsdp_equiv train --out PREFIX [options]\n"
                    "       test_fsdp_equiv compare REF OTHER --rtol TOL [--label TEXT] "
                    "[--losses-only]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    if (strcmp(argv[1], "compare") == 0) {
        if (argc < 4) return usage();
        double rtol = -1;
        bool losses_only = false;
        const char *label = argv[3];
        for (int i = 4; i < argc; i++) {
            if (strcmp(argv[i], "--losses-only") == 0) losses_only = true;
            else if (i + 1 == argc) return usage();
            else if (strcmp(argv[i], "--rtol") == 0) rtol = strtod(argv[++i], NULL);
            else if (strcmp(argv[i], "--label") == 0) label = argv[++i];
            else return usage();
        }
        if (!(rtol >= 0)) return usage();
        return compare(argv[2], argv[3], rtol, losses_only, label);
    }
    if (strcmp(argv[1], "train") != 0) return usage();
    train_opts o = {.steps = 10, .batch = 24, .accum = 1, .lr = 1e-3f, .reshard = -1,
                    .cfg = {.layers = 4, .in_dim = 32, .width = 64, .out_dim = 16, .seed = 42}};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool used = true;
        if (strcmp(a, "--bf16") == 0) o.bf16 = true, used = false;
        else if (strcmp(a, "--no-prefetch") == 0) o.no_prefetch = true, used = false;
        else if (strcmp(a, "--expect-clip") == 0) o.expect_clip = true, used = false;
        else if (!v) return usage();
        else if (strcmp(a, "--out") == 0) o.out = v;
        else if (strcmp(a, "--steps") == 0) o.steps = atoi(v);
        else if (strcmp(a, "--batch") == 0) o.batch = atoi(v);
        else if (strcmp(a, "--accum") == 0) o.accum = atoi(v);
        else if (strcmp(a, "--lr") == 0) o.lr = strtof(v, NULL);
        else if (strcmp(a, "--clip") == 0) o.clip = strtof(v, NULL);
        else if (strcmp(a, "--reshard") == 0) o.reshard = atoi(v);
        else if (strcmp(a, "--gathers") == 0) {
            if (strcmp(v, "mapped") && strcmp(v, "copied") && strcmp(v, "off")) return usage();
            o.gathers = v;
        }
        else if (strcmp(a, "--layers") == 0) o.cfg.layers = atoi(v);
        else if (strcmp(a, "--width") == 0) o.cfg.width = atoi(v);
        else if (strcmp(a, "--in") == 0) o.cfg.in_dim = atoi(v);
        else if (strcmp(a, "--out-dim") == 0) o.cfg.out_dim = atoi(v);
        else if (strcmp(a, "--hsdp") == 0) {
            if (sscanf(v, "%dx%d", &o.hsdp_r, &o.hsdp_s) != 2 || o.hsdp_r < 1 || o.hsdp_s < 1)
                return usage();
        } else return usage();
        i += used;
    }
    if (!o.out || o.steps < 1 || o.accum < 1 || o.batch < 1 || o.batch % o.accum) return usage();
    /* The world size is known only after mt_init; train() checks the split per rank count. */
    return train(&o);
}
