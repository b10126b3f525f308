/* AdamW over the local f32 master shards of an FSDP root (include/meshtrain/optim.h). The state
 * (m and v) mirrors the shard views the engine gives (fsdp/fsdp_shards.h): one device block of 2n
 * floats per unit, charged to the optimizer category. Only the real ranges of a shard are
 * updated, so padding stays exactly 0 whatever the engine leaves in its gradient there.
 *
 * An offloaded unit's shards are in the host tier (view.host): its state goes there too, and its
 * step is the host AdamW called directly (core/cpu/adamw_host.h, the CPU device's mt_op_adamw, so
 * the same bits) on the rank's thread pool, whatever the device is. */
#include "core/cpu/adamw_host.h"
#include "core/error.h"
#include "fsdp/fsdp_shards.h"

#include <meshtrain/host_memory.h>
#include <meshtrain/ops.h>
#include <meshtrain/optim.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct mt_adamw {
    mt_module *root;
    mt_device *dev;
    mt_adamw_options o;
    long steps;
    long steps_taken; /* by this optimizer object (steps may come from a checkpoint) */
    size_t n_units;
    size_t *shard_n; /* each unit's shard size when the optimizer was created */
    float **state;   /* per unit: m then v, 2 * shard_n floats */
    bool *host;      /* per unit: state (and shards) in the host tier */
    mt_thread_pool *pool; /* the host AdamW's, when some unit is offloaded */
    mt_adamw_isa isa;
};

static mt_status check_options(const mt_adamw_options *in, mt_adamw_options *out) {
    mt_adamw_options o = *in;
    if (o.beta1 == 0.0f && o.beta2 == 0.0f) {
        o.beta1 = 0.9f;
        o.beta2 = 0.999f;
    }
    if (o.eps == 0.0f) o.eps = 1e-8f;
    if (!(o.lr >= 0.0f) || !isfinite(o.lr))
        return mt_error(MT_ERR_INVALID_ARG, "adamw: learning rate %g is not a finite value >= 0",
                        (double)o.lr);
    if (!(o.beta1 >= 0.0f && o.beta1 < 1.0f) || !(o.beta2 >= 0.0f && o.beta2 < 1.0f))
        return mt_error(MT_ERR_INVALID_ARG, "adamw: betas (%g, %g) must lie in [0, 1)",
                        (double)o.beta1, (double)o.beta2);
    if (!(o.eps > 0.0f))
        return mt_error(MT_ERR_INVALID_ARG, "adamw: eps %g must be > 0", (double)o.eps);
    if (!(o.weight_decay >= 0.0f) || !isfinite(o.weight_decay))
        return mt_error(MT_ERR_INVALID_ARG, "adamw: weight decay %g is not a finite value >= 0",
                        (double)o.weight_decay);
    *out = o;
    return MT_OK;
}

mt_status mt_adamw_create(mt_module *root, const mt_adamw_options *options, mt_adamw **out) {
    if (!root || !options || !out)
        return mt_error(MT_ERR_INVALID_ARG, "adamw: root, options and out must not be NULL");
    *out = NULL;
    mt_adamw_options o;
    MT_TRY(check_options(options, &o));
    mt_fsdp_shard_view *views = NULL;
    size_t n = 0;
    mt_status st = mt_fsdp_collect_shards(root, &views, &n);
    if (st != MT_OK)
        return mt_error_wrap(st, "adamw: module '%s' has no FSDP shards (create the optimizer "
                                 "after mt_fsdp_shard on the root)",
                             mt_module_name(root));
    mt_adamw *opt = calloc(1, sizeof *opt);
    if (opt) {
        opt->shard_n = calloc(n ? n : 1, sizeof *opt->shard_n);
        opt->state = calloc(n ? n : 1, sizeof *opt->state);
        opt->host = calloc(n ? n : 1, sizeof *opt->host);
    }
    if (!opt || !opt->shard_n || !opt->state || !opt->host) {
        free(views);
        mt_adamw_destroy(opt);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "adamw: out of host memory for %zu units", n);
    }
    opt->root = root;
    opt->dev = mt_fsdp_device(root);
    opt->o = o;
    opt->n_units = n;
    for (size_t u = 0; u < n && st == MT_OK; u++) {
        size_t bytes = 2 * views[u].n * sizeof(float);
        opt->shard_n[u] = views[u].n;
        opt->host[u] = views[u].host;
        if (views[u].host && !opt->pool) {
            st = mt_thread_pool_get(&opt->pool);
            if (st == MT_OK) st = mt_adamw_isa_select(&opt->isa);
            if (st != MT_OK) break;
        }
        if (views[u].host) {
            st = mt_host_tier_alloc(opt->dev, bytes, MT_MEM_OPTIMIZER, (void **)&opt->state[u]);
            if (st == MT_OK) memset(opt->state[u], 0, bytes);
        } else {
            st = mt_device_alloc(opt->dev, bytes, MT_MEM_OPTIMIZER, (void **)&opt->state[u]);
            if (st == MT_OK) st = mt_device_memset(opt->dev, opt->state[u], 0, bytes, NULL);
        }
        if (st != MT_OK)
            st = mt_error_wrap(st, "adamw: state of unit '%s' (%zu shard elements)",
                               views[u].unit_name, views[u].n);
    }
    free(views);
    if (st != MT_OK) {
        mt_adamw_destroy(opt);
        return st;
    }
    *out = opt;
    return MT_OK;
}

/* The engine may move shards between steps; their sizes must not change. */
static mt_status update_unit(mt_adamw *opt, size_t u, const mt_fsdp_shard_view *view, long t) {
    if (view->n != opt->shard_n[u])
        return mt_error(MT_ERR_INTERNAL,
                        "adamw: unit '%s' has %zu shard elements, %zu when the optimizer was "
                        "created",
                        view->unit_name, view->n, opt->shard_n[u]);
    float *m = opt->state[u], *v = m + view->n;
    for (size_t r = 0; r < view->n_ranges; r++) {
        size_t b = view->ranges[r].begin, e = view->ranges[r].end;
        if (b > e || e > view->n)
            return mt_error(MT_ERR_INTERNAL, "adamw: unit '%s' range [%zu, %zu) outside its %zu "
                            "shard elements", view->unit_name, b, e, view->n);
        if (view->host != opt->host[u])
            return mt_error(MT_ERR_INTERNAL, "adamw: unit '%s' moved between the device and the "
                            "host tier since the optimizer was created", view->unit_name);
        if (view->host)
            MT_TRY(mt_host_adamw(opt->pool, opt->isa, view->param + b, view->grad + b, m + b,
                                 v + b, e - b, t, opt->o.lr, opt->o.beta1, opt->o.beta2,
                                 opt->o.eps, opt->o.weight_decay));
        else
            MT_TRY(mt_op_adamw(opt->dev, view->param + b, view->grad + b, m + b, v + b, e - b,
                               t, opt->o.lr, opt->o.beta1, opt->o.beta2, opt->o.eps,
                               opt->o.weight_decay));
    }
    return MT_OK;
}

mt_status mt_adamw_step(mt_adamw *opt) {
    if (!opt) return mt_error(MT_ERR_INVALID_ARG, "adamw: step on a NULL optimizer");
    /* Checked at the first step rather than at creation: a program creates the optimizer
     * before loading a checkpoint into it, which is what gives a resumed model its values. */
    if (opt->steps_taken == 0)
        MT_TRY(mt_fsdp_check_initialised(opt->root, "the optimizer's step"));
    mt_fsdp_shard_view *views = NULL;
    size_t n = 0;
    MT_TRY(mt_fsdp_collect_shards(opt->root, &views, &n));
    mt_status st = MT_OK;
    if (n != opt->n_units)
        st = mt_error(MT_ERR_INVALID_ARG,
                      "adamw: module '%s' has %zu FSDP units, %zu when the optimizer was created "
                      "(shard every unit before creating the optimizer)",
                      mt_module_name(opt->root), n, opt->n_units);
    long t = opt->steps + 1;
    for (size_t u = 0; u < n && st == MT_OK; u++) st = update_unit(opt, u, &views[u], t);
    free(views);
    if (st != MT_OK) return st;
    opt->steps = t;
    opt->steps_taken++;
    return mt_fsdp_shards_updated(opt->root);
}

void mt_adamw_set_lr(mt_adamw *opt, float lr) {
    if (opt) opt->o.lr = lr;
}

long mt_adamw_steps(const mt_adamw *opt) { return opt ? opt->steps : 0; }

void mt_adamw_set_steps(mt_adamw *opt, long steps) {
    if (opt && steps >= 0) opt->steps = steps;
}

mt_adamw_options mt_adamw_get_options(const mt_adamw *opt) {
    return opt ? opt->o : (mt_adamw_options){0};
}

mt_module *mt_adamw_root(const mt_adamw *opt) { return opt ? opt->root : NULL; }

size_t mt_adamw_unit_count(const mt_adamw *opt) { return opt ? opt->n_units : 0; }

mt_status mt_adamw_state(mt_adamw *opt, size_t unit, float **exp_avg, float **exp_avg_sq,
                         size_t *n) {
    if (!opt) return mt_error(MT_ERR_INVALID_ARG, "mt_adamw_state: NULL optimizer");
    if (unit >= opt->n_units)
        return mt_error(MT_ERR_INVALID_ARG, "mt_adamw_state: unit %zu of %zu", unit,
                        opt->n_units);
    if (exp_avg) *exp_avg = opt->state[unit];
    if (exp_avg_sq) *exp_avg_sq = opt->state[unit] + opt->shard_n[unit];
    if (n) *n = opt->shard_n[unit];
    return MT_OK;
}

void mt_adamw_destroy(mt_adamw *opt) {
    if (!opt) return;
    if (opt->state)
        for (size_t u = 0; u < opt->n_units; u++) {
            if (opt->host && opt->host[u]) mt_host_tier_free(opt->dev, opt->state[u]);
            else mt_device_free(opt->dev, opt->state[u]);
        }
    free(opt->state);
    free(opt->host);
    free(opt->shard_n);
    free(opt);
}
