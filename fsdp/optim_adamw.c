/* AdamW over the local f32 master shards of an FSDP root (include/meshtrain/optim.h). The state
 * (m and v) mirrors the shard views the engine gives (fsdp/fsdp_shards.h): one device block of 2n
 * floats per unit, charged to the optimizer category. Only the real ranges of a shard are
 * updated, so padding stays exactly 0 whatever the engine leaves in its gradient there.
 *
 * An offloaded unit's shards are in the host tier (view.host): its state goes there too, and its
 * step is the host AdamW called directly (core/cpu/adamw_host.h, the CPU device's mt_op_adamw, so
 * the same bits) on the rank's thread pool, whatever the device is.
 *
 * Overlap (mt_adamw_set_overlap): FSDP calls the grad_landed hook when an offloaded unit's
 * reduced gradient is complete in its host gradient; the hook queues that unit's update for the
 * optimizer thread, which runs update_unit exactly as mt_adamw_step would (same t, same
 * options), so the bits do not change. The host AdamW on that thread shares the thread pool with
 * the backward: a job that finds the pool busy runs on its caller alone (core/thread_pool.c),
 * which splits the same elementwise loop differently and gives the same values. */
#include "core/cpu/adamw_host.h"
#include "core/cpu/ops_cpu.h"
#include "core/error.h"
#include "core/thread_name.h"
#include "fsdp/fsdp_shards.h"

#include <meshtrain/host_memory.h>
#include <meshtrain/ops.h>
#include <meshtrain/optim.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
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
    /* The overlapped step: a thread, the queue of units to step (each at most once per step),
     * guarded by lock. */
    bool overlap;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake, idle;
    mt_fsdp_shard_view *queue; /* n_units slots: views of the queued units */
    size_t *queue_unit;
    size_t q_head, q_tail;     /* queued [q_head, q_tail) since the last step; taken below q_head */
    bool running, stop;        /* the thread is inside update_unit; asked to end */
    bool *queued;              /* per unit: queued since the last step */
    long overlapped, last_overlapped; /* queued while the backward continued */
    mt_status err;             /* the first failure on the thread, and its message */
    char err_msg[1024];
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
        else if (view->grad_scale != 1.0f) /* a clipping factor deferred on the CPU device */
            MT_TRY(mt_cpu_op_adamw_scaled(view->param + b, view->grad + b, view->grad_scale,
                                          m + b, v + b, e - b, t, opt->o.lr, opt->o.beta1,
                                          opt->o.beta2, opt->o.eps, opt->o.weight_decay));
        else
            MT_TRY(mt_op_adamw(opt->dev, view->param + b, view->grad + b, m + b, v + b, e - b,
                               t, opt->o.lr, opt->o.beta1, opt->o.beta2, opt->o.eps,
                               opt->o.weight_decay));
    }
    return MT_OK;
}

/* ---- the overlapped step ------------------------------------------------------------------ */

static void *overlap_main(void *arg) {
    mt_name_this_thread("mt-adamw");
    mt_adamw *opt = arg;
    pthread_mutex_lock(&opt->lock);
    for (;;) {
        while (!opt->stop && opt->q_head == opt->q_tail) pthread_cond_wait(&opt->wake, &opt->lock);
        if (opt->q_head == opt->q_tail) break; /* stop, nothing left */
        size_t u = opt->queue_unit[opt->q_head];
        mt_fsdp_shard_view view = opt->queue[opt->q_head];
        opt->q_head++;
        opt->running = true;
        bool failed = opt->err != MT_OK;
        long t = opt->steps + 1; /* steps changes only in mt_adamw_step, after drain */
        pthread_mutex_unlock(&opt->lock);
        /* After a failure the rest is not stepped: mt_adamw_step reports the failure. */
        mt_status st = failed ? MT_OK : update_unit(opt, u, &view, t);
        pthread_mutex_lock(&opt->lock);
        if (st != MT_OK && opt->err == MT_OK) {
            opt->err = st;
            snprintf(opt->err_msg, sizeof opt->err_msg, "%s", mt_last_error());
        }
        opt->running = false;
        if (opt->q_head == opt->q_tail) pthread_cond_broadcast(&opt->idle);
    }
    pthread_mutex_unlock(&opt->lock);
    return NULL;
}

/* Waits until the thread has stepped every queued unit; returns its failure, if any. */
static mt_status drain(mt_adamw *opt) {
    if (!opt->overlap) return MT_OK;
    pthread_mutex_lock(&opt->lock);
    while (opt->running || opt->q_head != opt->q_tail) pthread_cond_wait(&opt->idle, &opt->lock);
    mt_status st = opt->err;
    char msg[sizeof opt->err_msg];
    snprintf(msg, sizeof msg, "%s", opt->err_msg);
    opt->err = MT_OK;
    pthread_mutex_unlock(&opt->lock);
    if (st != MT_OK)
        return mt_error(st, "adamw: overlapped step (on the optimizer thread): %s", msg);
    return MT_OK;
}

/* FSDP's grad_landed hook (fsdp/fsdp_shards.h), on the thread running the backward: it gets the
 * landed unit's own view and index, so a landing allocates nothing and waits for nothing but
 * that unit's parameter copy (FSDP quiesced it); the other units' staging runs on. */
static mt_status grad_landed(void *arg, const mt_fsdp_shard_view *view, size_t u, size_t n,
                             bool backward_continues) {
    mt_adamw *opt = arg;
    if (opt->steps_taken == 0)
        MT_TRY(mt_fsdp_check_initialised(opt->root, "the optimizer's overlapped step"));
    if (n != opt->n_units || u >= n)
        return mt_error(MT_ERR_INTERNAL, "adamw: overlapped step: unit '%s' whose gradient "
                        "landed is unit %zu of %zu, but the optimizer of '%s' has %zu units",
                        view->unit_name, u, n, mt_module_name(opt->root), opt->n_units);
    if (opt->queued[u])
        return mt_error(MT_ERR_INVALID_ARG,
                        "adamw: overlapped step: unit '%s' got a second synchronised gradient "
                        "before mt_adamw_step; the overlap steps each unit on its first, so it "
                        "needs one synchronising backward per step (turn off gradient sync on "
                        "earlier micro-batches, or the overlap)", view->unit_name);
    pthread_mutex_lock(&opt->lock);
    opt->queued[u] = true;
    opt->queue[opt->q_tail] = *view;
    opt->queue_unit[opt->q_tail++] = u;
    if (backward_continues) opt->overlapped++;
    pthread_cond_signal(&opt->wake);
    pthread_mutex_unlock(&opt->lock);
    return MT_OK;
}

/* Waits until the thread has stepped every queued unit, leaving a failure for mt_adamw_step. */
static void wait_idle(mt_adamw *opt) {
    pthread_mutex_lock(&opt->lock);
    while (opt->running || opt->q_head != opt->q_tail) pthread_cond_wait(&opt->idle, &opt->lock);
    pthread_mutex_unlock(&opt->lock);
}

/* FSDP's pass_begin hook: a forward starts. Normally mt_adamw_step drained the queue already; a
 * forward without a step between (a second synchronising backward, refused at its first landing)
 * would otherwise stage masters the thread is still writing. */
static mt_status pass_begin(void *arg) {
    wait_idle(arg);
    return MT_OK;
}

/* Frees the queue and, when sync, the lock and conditions (the thread has ended or never ran). */
static void free_overlap(mt_adamw *opt, bool sync) {
    if (sync) {
        pthread_cond_destroy(&opt->wake);
        pthread_cond_destroy(&opt->idle);
        pthread_mutex_destroy(&opt->lock);
    }
    free(opt->queue);
    free(opt->queue_unit);
    free(opt->queued);
    opt->queue = NULL;
    opt->queue_unit = NULL;
    opt->queued = NULL;
}

static void overlap_stop(mt_adamw *opt) {
    if (!opt->overlap) return;
    drain(opt);
    mt_fsdp_set_grad_landed(opt->root, NULL, NULL, NULL);
    pthread_mutex_lock(&opt->lock);
    opt->stop = true;
    pthread_cond_signal(&opt->wake);
    pthread_mutex_unlock(&opt->lock);
    pthread_join(opt->thread, NULL);
    free_overlap(opt, true);
    opt->overlap = false;
    opt->stop = false;
}

mt_status mt_adamw_set_overlap(mt_adamw *opt, bool on) {
    if (!opt) return mt_error(MT_ERR_INVALID_ARG, "mt_adamw_set_overlap: NULL optimizer");
    if (!on) {
        overlap_stop(opt);
        return MT_OK;
    }
    if (opt->overlap) return MT_OK;
    bool any = false;
    for (size_t u = 0; u < opt->n_units; u++) any = any || opt->host[u];
    if (!any)
        return mt_error(MT_ERR_INVALID_ARG,
                        "mt_adamw_set_overlap: no unit of '%s' is offloaded; the overlapped step "
                        "runs the host AdamW of offloaded units (shard with "
                        "mt_fsdp_options.offload optimizer or full)", mt_module_name(opt->root));
    size_t n = opt->n_units;
    opt->queue = calloc(n, sizeof *opt->queue);
    opt->queue_unit = calloc(n, sizeof *opt->queue_unit);
    opt->queued = calloc(n, sizeof *opt->queued);
    if (!opt->queue || !opt->queue_unit || !opt->queued) {
        free_overlap(opt, false);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "mt_adamw_set_overlap: out of host memory for the "
                        "queue of %zu units", n);
    }
    pthread_mutex_init(&opt->lock, NULL);
    pthread_cond_init(&opt->wake, NULL);
    pthread_cond_init(&opt->idle, NULL);
    opt->q_head = opt->q_tail = 0;
    opt->overlapped = opt->last_overlapped = 0;
    opt->err = MT_OK;
    opt->stop = opt->running = false;
    int rc = pthread_create(&opt->thread, NULL, overlap_main, opt);
    if (rc != 0) {
        free_overlap(opt, true);
        return mt_error(MT_ERR_INTERNAL, "mt_adamw_set_overlap: cannot start the optimizer "
                        "thread: %s", strerror(rc));
    }
    opt->overlap = true;
    mt_status st = mt_fsdp_set_grad_landed(opt->root, grad_landed, pass_begin, opt);
    if (st != MT_OK) overlap_stop(opt);
    return st;
}

long mt_adamw_overlapped_units(const mt_adamw *opt) {
    return opt && opt->overlap ? opt->last_overlapped : 0;
}

mt_status mt_adamw_step(mt_adamw *opt) {
    if (!opt) return mt_error(MT_ERR_INVALID_ARG, "adamw: step on a NULL optimizer");
    /* Checked at the first step rather than at creation: a program creates the optimizer
     * before loading a checkpoint into it, which is what gives a resumed model its values. */
    if (opt->steps_taken == 0)
        MT_TRY(mt_fsdp_check_initialised(opt->root, "the optimizer's step"));
    mt_fsdp_shard_view *views = NULL;
    size_t n = 0;
    MT_TRY(mt_fsdp_collect_shards_for_step(opt->root, &views, &n));
    mt_status st = MT_OK;
    if (n != opt->n_units)
        st = mt_error(MT_ERR_INVALID_ARG,
                      "adamw: module '%s' has %zu FSDP units, %zu when the optimizer was created "
                      "(shard every unit before creating the optimizer)",
                      mt_module_name(opt->root), n, opt->n_units);
    long t = opt->steps + 1;
    mt_status d = drain(opt); /* before anything below reads or resets the queue */
    if (st == MT_OK) st = d;
    for (size_t u = 0; u < n && st == MT_OK; u++)
        if (!opt->overlap || !opt->queued[u]) st = update_unit(opt, u, &views[u], t);
    free(views);
    if (opt->overlap) { /* the next backward queues afresh, whatever this step gave */
        opt->last_overlapped = opt->overlapped;
        opt->overlapped = 0;
        opt->q_head = opt->q_tail = 0;
        memset(opt->queued, 0, opt->n_units * sizeof *opt->queued);
    }
    if (st != MT_OK) return st;
    opt->steps = t;
    opt->steps_taken++;
    return mt_fsdp_shards_updated(opt->root);
}

void mt_adamw_set_lr(mt_adamw *opt, float lr) {
    if (!opt) return;
    /* A started step reads the options; its failure, if any, stays for mt_adamw_step. */
    if (opt->overlap) wait_idle(opt);
    opt->o.lr = lr;
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
    overlap_stop(opt);
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
