/* Parameter initialisers (include/meshtrain/init.h): a value per global element, computed on the
 * part of the parameter this rank holds (an FSDP shard or its tp-local storage).
 *
 * What a rank holds is always a contiguous range [b, e) of the parameter's tp-local elements in
 * row-major order (FSDP cuts the flat concatenation of its parameters). The range is walked in
 * runs along the last dimension: within a run the global indices are consecutive, whatever the
 * tp placement, so each run costs one index conversion. */
#include "module/module_internal.h"
#include "module/param_hash.h"

#include "core/cpu/parallel.h"
#include "core/error.h"

#include <meshtrain/device.h>
#include <meshtrain/host_memory.h>
#include <meshtrain/init.h>

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

mt_initialiser mt_init_zeros(void) { return (mt_initialiser){.kind = MT_INIT_ZEROS}; }
mt_initialiser mt_init_ones(void) { return (mt_initialiser){.kind = MT_INIT_ONES}; }

mt_initialiser mt_init_normal(double mean, double std, uint64_t seed, uint64_t stream) {
    return (mt_initialiser){.kind = MT_INIT_NORMAL, .a = mean, .b = std, .seed = seed, .stream = stream};
}

mt_initialiser mt_init_uniform(double low, double high, uint64_t seed, uint64_t stream) {
    return (mt_initialiser){.kind = MT_INIT_UNIFORM, .a = low, .b = high, .seed = seed,
                     .stream = stream};
}

mt_initialiser mt_init_function(mt_init_fn fn, void *user) {
    return (mt_initialiser){.kind = MT_INIT_FN, .fn = fn, .user = user};
}

static mt_status check_init(const mt_param *p, const mt_initialiser *init, const char *what) {
    if (!p || !init) return mt_error(MT_ERR_INVALID_ARG, "%s: param and init are required", what);
    const char *pn = p->name, *mn = p->owner->name;
    switch (init->kind) {
    case MT_INIT_ZEROS:
    case MT_INIT_ONES:
        return MT_OK;
    case MT_INIT_NORMAL:
        if (isfinite(init->a) && isfinite(init->b) && init->b >= 0) return MT_OK;
        return mt_error(MT_ERR_INVALID_ARG, "%s: normal(mean %g, std %g) for parameter '%s' of "
                        "module '%s': mean and std must be finite and std >= 0", what, init->a,
                        init->b, pn, mn);
    case MT_INIT_UNIFORM:
        if (isfinite(init->a) && isfinite(init->b) && init->a <= init->b) return MT_OK;
        return mt_error(MT_ERR_INVALID_ARG, "%s: uniform(low %g, high %g) for parameter '%s' of "
                        "module '%s': the bounds must be finite and low <= high", what, init->a,
                        init->b, pn, mn);
    case MT_INIT_FN:
        if (init->fn) return MT_OK;
        return mt_error(MT_ERR_INVALID_ARG, "%s: a function initialiser without a function for "
                        "parameter '%s' of module '%s'", what, pn, mn);
    }
    return mt_error(MT_ERR_INVALID_ARG, "%s: unknown initialiser kind %d for parameter '%s' of "
                    "module '%s'", what, (int)init->kind, pn, mn);
}

/* An initialiser runs once, on a deferred parameter without values. */
static mt_status check_empty(const mt_param *p) {
    if (!p->deferred)
        return mt_error(MT_ERR_INVALID_ARG, "mt_param_init: parameter '%s' of module '%s' was "
                        "created with values (mt_module_add_param); initialisers run on "
                        "parameters created with mt_module_add_param_deferred", p->name,
                        p->owner->name);
    if (p->initialised)
        return mt_error(MT_ERR_INVALID_ARG, "mt_param_init: parameter '%s' of module '%s' "
                        "already holds values (initialised, or loaded from a checkpoint); an "
                        "initialiser runs once, before the parameter has values", p->name,
                        p->owner->name);
    return MT_OK;
}

/* count values of the run whose first element has global multi-index g (linear index g0). */
static mt_status fill_run(const mt_param *p, const mt_initialiser *init, const int64_t *g, uint64_t g0,
                          size_t count, float *out) {
    /* Padding rows are not part of the model: they stay 0 (mt_param_set_padding). */
    if ((p->ndim > 0 && g[0] >= p->real_rows) || init->kind == MT_INIT_ZEROS) {
        memset(out, 0, count * sizeof *out);
        return MT_OK;
    }
    switch (init->kind) {
    case MT_INIT_ONES:
        for (size_t j = 0; j < count; j++) out[j] = 1.0f;
        break;
    case MT_INIT_NORMAL:
        for (size_t j = 0; j < count; j++) {
            /* std * z first: with mean 0 the values are GPT-2's init_param's, bit for bit. */
            double v = init->b * mt_hash_normal(init->seed, init->stream, g0 + j);
            out[j] = (float)(init->a != 0.0 ? v + init->a : v);
        }
        break;
    case MT_INIT_UNIFORM:
        for (size_t j = 0; j < count; j++) {
            double u = mt_hash_open_unit(init->seed, init->stream, g0 + j, 3);
            out[j] = (float)(init->a + (init->b - init->a) * u);
        }
        break;
    default: {
        mt_status st = init->fn(init->user, p, g, count, out);
        if (st != MT_OK)
            return mt_error_wrap(st, "the initialiser function of parameter '%s' of module '%s'",
                                 p->name, p->owner->name);
    }
    }
    return MT_OK;
}

/* The values of tp-local elements [b, e) into out (host-addressable memory). */
static mt_status fill_host(const mt_param *p, const mt_initialiser *init, size_t b, size_t e,
                           float *out) {
    int nd = p->ndim, tp_rank = mt_module_tp_rank(p->owner);
    int64_t idx[MT_PARAM_MAX_DIMS] = {0}, g[MT_PARAM_MAX_DIMS] = {0};
    size_t rem = b;
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = (int64_t)(rem % (size_t)p->local_shape[d]);
        rem /= (size_t)p->local_shape[d];
    }
    for (size_t pos = b; pos < e;) {
        size_t run = e - pos;
        if (nd > 0 && run > (size_t)(p->local_shape[nd - 1] - idx[nd - 1]))
            run = (size_t)(p->local_shape[nd - 1] - idx[nd - 1]);
        uint64_t g0 = 0;
        for (int d = 0; d < nd; d++) {
            g[d] = idx[d];
            if (p->tp.kind == MT_TP_SHARD && p->tp.dim == d) g[d] += tp_rank * p->local_shape[d];
            g0 = g0 * (uint64_t)p->global_shape[d] + (uint64_t)g[d];
        }
        /* fill_run decides padding by the run's first element; a 1-D parameter's run spans
         * dimension 0 itself, so it is cut at real_rows: the real rows get values, the padding
         * rows (the next run) zeros, and the user function never sees a padding row. */
        if (nd == 1 && g[0] < p->real_rows && g[0] + (int64_t)run > p->real_rows)
            run = (size_t)(p->real_rows - g[0]);
        MT_TRY(fill_run(p, init, g, g0, run, out + (pos - b)));
        pos += run;
        if (nd == 0) break;
        idx[nd - 1] += (int64_t)run; /* to the next row, carrying */
        for (int d = nd - 1; d > 0 && idx[d] >= p->local_shape[d]; d--) {
            idx[d] = 0;
            idx[d - 1]++;
        }
    }
    return MT_OK;
}

/* Elements per chunk of a seeded fill on the pool: about 0.4 ms of hashing, a logarithm and a
 * cosine per element, far above a hand-off's few microseconds. */
#define INIT_GRAIN ((size_t)4096)

typedef struct fill_job {
    const mt_param *p;
    const mt_initialiser *init;
    size_t b;   /* the range's first tp-local element, out[0] */
    float *out;
    _Atomic mt_status status; /* the first failure, MT_OK while none */
} fill_job;

static void fill_chunk(void *ctx, size_t chunk, size_t begin, size_t end) {
    (void)chunk;
    fill_job *j = ctx;
    mt_status st = fill_host(j->p, j->init, j->b + begin, j->b + end, j->out + begin);
    mt_status ok = MT_OK;
    if (st != MT_OK) atomic_compare_exchange_strong(&j->status, &ok, st);
}

/* fill_host on the rank's pool where the values are seeded (normal, uniform): each is a function
 * of its global index alone and fill_host starts anywhere in a row, so fixed chunks of the range
 * give the same bits with any thread count. A model's start no longer waits for one core (the
 * initialiser was half of train_gpt's one-step run at 85 M parameters, docs/benchmarks.md). A
 * user's function is called from the calling thread only, as before: it need not be
 * thread-safe. */
static mt_status fill_host_pooled(const mt_param *p, const mt_initialiser *init, size_t b,
                                  size_t e, float *out) {
    bool seeded = init->kind == MT_INIT_NORMAL || init->kind == MT_INIT_UNIFORM;
    if (!seeded || e - b <= INIT_GRAIN) return fill_host(p, init, b, e, out);
    fill_job job = {.p = p, .init = init, .b = b, .out = out, .status = MT_OK};
    MT_TRY(mt_cpu_parallel("a parameter initialiser", e - b, INIT_GRAIN, fill_chunk, &job));
    return atomic_load(&job.status);
}

/* Writes the values of tp-local elements [b, e) to dst (device memory): in place on the CPU,
 * through a bounded host buffer on a GPU, so that nothing beyond the destination is charged to
 * the device. */
static mt_status write_range(const mt_param *p, const mt_initialiser *init, float *dst, size_t b,
                             size_t e) {
    mt_device *dev = p->owner->dev;
    /* A shard offloaded to the host tier (FSDP offload) is host memory on any device. */
    if (mt_device_get_kind(dev) == MT_DEVICE_CPU ||
        mt_host_tier_contains(dev, dst, (e - b) * sizeof *dst))
        return fill_host_pooled(p, init, b, e, dst);
    size_t cap = e - b < MT_INIT_STAGING_ELEMS ? e - b : MT_INIT_STAGING_ELEMS;
    float *host = malloc((cap ? cap : 1) * sizeof *host);
    if (!host)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "initialising parameter '%s' of module '%s': out of "
                        "host memory for %zu staging values", p->name, p->owner->name, cap);
    mt_status st = MT_OK;
    for (size_t pos = b; pos < e && st == MT_OK; pos += cap) {
        size_t n = e - pos < cap ? e - pos : cap;
        st = fill_host_pooled(p, init, pos, pos + n, host);
        if (st == MT_OK)
            st = mt_device_copy(dev, dst + (pos - b), host, n * sizeof *host,
                                MT_COPY_HOST_TO_DEVICE, NULL);
    }
    free(host);
    return st;
}

/* Not held by a library: the parameter's own tp-local storage, allocated here. */
static mt_status init_own(mt_param *p, const mt_initialiser *init) {
    mt_device *dev = p->owner->dev;
    void *data = NULL;
    mt_status st = mt_device_alloc(dev, p->numel * sizeof(float), MT_MEM_PARAMS, &data);
    if (st != MT_OK)
        return mt_error_wrap(st, "initialising parameter '%s' of module '%s' (%zu values, not "
                             "sharded)", p->name, p->owner->name, p->numel);
    st = write_range(p, init, data, 0, p->numel);
    if (st != MT_OK) {
        mt_device_free(dev, data);
        return st;
    }
    p->data = data;
    p->own_data = true;
    p->dtype = MT_F32;
    return MT_OK;
}

mt_status mt_param_init(mt_param *param, const mt_initialiser *init) {
    MT_TRY(check_init(param, init, "mt_param_init"));
    MT_TRY(check_empty(param));
    mt_param *p = param;
    if (!p->held_by) {
        MT_TRY(init_own(p, init));
    } else if (p->held_end > p->held_begin) {
        MT_TRY(write_range(p, init, p->held, p->held_begin, p->held_end));
        if (p->held_written) MT_TRY(p->held_written(p, p->held_ctx));
    }
    p->initialised = true;
    return MT_OK;
}

mt_status mt_param_set_init(mt_param *param, const mt_initialiser *init) {
    MT_TRY(check_init(param, init, "mt_param_set_init"));
    if (!param->deferred)
        return mt_error(MT_ERR_INVALID_ARG, "mt_param_set_init: parameter '%s' of module '%s' "
                        "was created with values (mt_module_add_param); record initialisers on "
                        "parameters created with mt_module_add_param_deferred", param->name,
                        param->owner->name);
    param->init = *init;
    param->has_init = true;
    return MT_OK;
}

/* The first parameter of m's subtree that needs values but has no recorded initialiser. */
static const mt_param *missing_init(const mt_module *m) {
    for (size_t i = 0; i < m->n_params; i++)
        if (mt_param_needs_init(m->params[i]) && !m->params[i]->has_init) return m->params[i];
    for (size_t i = 0; i < m->n_children; i++) {
        const mt_param *p = missing_init(m->children[i]);
        if (p) return p;
    }
    return NULL;
}

static mt_status init_tree(mt_module *m) {
    for (size_t i = 0; i < m->n_params; i++)
        if (mt_param_needs_init(m->params[i]))
            MT_TRY(mt_param_init(m->params[i], &m->params[i]->init));
    for (size_t i = 0; i < m->n_children; i++) MT_TRY(init_tree(m->children[i]));
    return MT_OK;
}

mt_status mt_module_init_params(mt_module *module) {
    if (!module) return mt_error(MT_ERR_INVALID_ARG, "mt_module_init_params: module is NULL");
    /* Checked first, so that a missing record leaves the tree as it was. */
    const mt_param *p = missing_init(module);
    if (p)
        return mt_error(MT_ERR_INVALID_ARG, "mt_module_init_params('%s'): parameter '%s' of "
                        "module '%s' has no values and no recorded initialiser "
                        "(mt_param_set_init), nor was it loaded from a checkpoint", module->name,
                        p->name, p->owner->name);
    return init_tree(module);
}
