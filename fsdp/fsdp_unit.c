/* FSDP units: turning a module's subtree into one flat, padded, sharded buffer, and the
 * unshard (one all-gather into a full buffer the parameters point into) / reshard (free it). */
#include "fsdp/fsdp_internal.h"
#include "fsdp/fsdp_mapped.h"
#include "fsdp/fsdp_offload.h"

#include "comm/shm_view.h"
#include "core/clock.h"
#include "core/cpu/ops_cpu.h"
#include "core/error.h"
#include "core/shm_block.h"

#include <meshtrain/log.h>
#include <meshtrain/ops.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

mt_fsdp_options mt_fsdp_defaults(mt_mesh *mesh, const char *shard_dim) {
    mt_fsdp_options o;
    memset(&o, 0, sizeof o);
    o.mesh = mesh;
    o.shard_dim = shard_dim;
    o.replicate_dim = NULL;
    o.reshard_after_forward = -1;
    o.param_dtype = MT_F32;
    o.reduce_dtype = MT_F32;
    o.offload = MT_OFFLOAD_NONE;
    o.offload_ratio = 1.0f;
    o.mapped_gather = true;
    return o;
}

/* FSDP's registration on a module is keyed by its hook table: one address of the library. */
mt_fsdp_unit *mt_fsdp_unit_of(const mt_module *module) {
    return mt_module_hooks_user(module, &mt_fsdp_hooks);
}

bool mt_fsdp_is_outermost(const mt_fsdp_unit *u) { return u->root->unit == u; }

mt_fsdp_unit *mt_fsdp_outermost(const mt_module *module) {
    mt_fsdp_unit *found = NULL;
    for (const mt_module *m = module; m; m = m->parent)
        if (mt_fsdp_unit_of(m)) found = mt_fsdp_unit_of(m);
    return found;
}

bool mt_fsdp_has_ancestor_unit(const mt_module *module) {
    for (const mt_module *m = module ? module->parent : NULL; m; m = m->parent)
        if (mt_fsdp_unit_of(m)) return true;
    return false;
}

size_t mt_fsdp_param_offset(const mt_fsdp_unit *u, size_t i) { return u->offsets[i]; }

const char *mt_fsdp_unit_desc(const mt_fsdp_unit *u, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "unit '%s' (", u->module->name);
    if (u->n_params == 0) n += snprintf(buf + n, n < (int)cap ? cap - (size_t)n : 0, "no params");
    for (size_t i = 0; i < u->n_params && n < (int)cap; i++) {
        if (i == 4) {
            n += snprintf(buf + n, cap - (size_t)n, ", ... %zu params", u->n_params);
            break;
        }
        n += snprintf(buf + n, cap - (size_t)n, "%sparam '%s.%s'", i ? ", " : "",
                      u->params[i]->owner->name, u->params[i]->name);
    }
    if (n < (int)cap) snprintf(buf + n, cap - (size_t)n, ")");
    return buf;
}

/* ---- collecting the tree ------------------------------------------------------------------ */

typedef struct ptr_list {
    void **items;
    size_t n, cap;
} ptr_list;

static bool list_push(ptr_list *l, void *p) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        void **items = realloc(l->items, cap * sizeof *items);
        if (!items) return false;
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = p;
    return true;
}

/* The parameters of m's subtree that no unit below m owns, depth-first, own params first. */
static bool collect_params(mt_module *m, bool top, ptr_list *out) {
    if (!top && mt_fsdp_unit_of(m)) return true;
    for (size_t i = 0; i < m->n_params; i++)
        if (!list_push(out, m->params[i])) return false;
    for (size_t i = 0; i < m->n_children; i++)
        if (!collect_params(m->children[i], false, out)) return false;
    return true;
}

/* Post-order (children first, in order, then the unit itself): the order in which a program
 * shards its layers and then the root, and the same on every rank. */
static bool collect_units(mt_module *m, ptr_list *out) {
    for (size_t i = 0; i < m->n_children; i++)
        if (!collect_units(m->children[i], out)) return false;
    mt_fsdp_unit *u = mt_fsdp_unit_of(m);
    return !u || list_push(out, u);
}

mt_status mt_fsdp_units_below(mt_module *module, mt_fsdp_unit ***units, size_t *n) {
    ptr_list l = {0};
    if (!collect_units(module, &l)) {
        free(l.items);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "module '%s': out of host memory listing units",
                        module->name);
    }
    *units = (mt_fsdp_unit **)l.items;
    *n = l.n;
    return MT_OK;
}

/* ---- sharding ------------------------------------------------------------------------------ */

static char *dup_opt(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static mt_status check_options(mt_module *m, const mt_fsdp_options *o, mt_group **shard,
                               mt_group **replicate) {
    if (!o->mesh || !o->shard_dim)
        return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_shard('%s'): options need a mesh and a "
                        "shard dimension (see mt_fsdp_defaults)", m->name);
    if (o->mesh != m->mesh)
        return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_shard('%s'): the options' mesh is not the "
                        "module's mesh", m->name);
    if (mt_mesh_dim_index(o->mesh, o->shard_dim) < 0)
        return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_shard('%s'): the mesh has no dimension "
                        "'%s' to shard over", m->name, o->shard_dim);
    if (o->replicate_dim && mt_mesh_dim_index(o->mesh, o->replicate_dim) < 0)
        return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_shard('%s'): the mesh has no dimension "
                        "'%s' to replicate over", m->name, o->replicate_dim);
    if (o->replicate_dim && strcmp(o->replicate_dim, o->shard_dim) == 0)
        return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_shard('%s'): the shard and replicate "
                        "dimensions are both '%s'", m->name, o->shard_dim);
    if ((o->param_dtype != MT_F32 && o->param_dtype != MT_BF16) ||
        (o->reduce_dtype != MT_F32 && o->reduce_dtype != MT_BF16))
        return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_shard('%s'): param_dtype and reduce_dtype "
                        "must be MT_F32 or MT_BF16", m->name);
    if (o->reshard_after_forward < -1 || o->reshard_after_forward > 1)
        return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_shard('%s'): reshard_after_forward must be "
                        "1, 0 or -1 (default)", m->name);
    if (mt_fsdp_unit_of(m))
        return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_shard('%s'): the module is already an FSDP "
                        "unit", m->name);
    if (mt_fsdp_has_ancestor_unit(m))
        return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_shard('%s'): an enclosing module is already "
                        "sharded; shard the layers first, then the root", m->name);
    MT_TRY(mt_mesh_group(o->mesh, o->shard_dim, shard));
    *replicate = NULL;
    if (o->replicate_dim) MT_TRY(mt_mesh_group(o->mesh, o->replicate_dim, replicate));
    return MT_OK;
}

/* The flat elements [*b, *e) of parameter i that lie in this rank's shard [lo, lo + S); false
 * if none. */
static bool shard_overlap(const mt_fsdp_unit *u, size_t i, size_t *b, size_t *e) {
    size_t lo = (size_t)u->rank * u->S, hi = lo + u->S, off = u->offsets[i];
    *b = off > lo ? off : lo;
    *e = off + u->params[i]->numel < hi ? off + u->params[i]->numel : hi;
    return *b < *e;
}

/* The runs of this rank's shard that hold real parameter elements. */
static mt_status build_ranges(mt_fsdp_unit *u) {
    size_t lo = (size_t)u->rank * u->S, b, e;
    u->ranges = calloc(u->n_params ? u->n_params : 1, sizeof *u->ranges);
    if (!u->ranges) return mt_error(MT_ERR_OUT_OF_MEMORY, "out of host memory");
    for (size_t i = 0; i < u->n_params; i++) {
        if (!shard_overlap(u, i, &b, &e)) continue;
        mt_fsdp_range *r = &u->ranges[u->n_ranges++];
        r->begin = b - lo;
        r->end = e - lo;
        r->tp_replicated = u->params[i]->tp.kind == MT_TP_REPLICATE;
    }
    return MT_OK;
}

static void free_buffers(mt_fsdp_unit *u) {
    /* The view first: it maps the master among the other ranks' shards. */
    mt_shm_view_unmap(u->view, u->padded * sizeof(float));
    u->view = NULL;
    mt_fsdp_offload_release(u); /* an offloaded unit's shards are host-tier blocks */
    mt_device_free(u->dev, u->master);
    mt_device_free(u->dev, u->shard_lp);
    mt_device_free(u->dev, u->grad_shard);
    free(u->grad_sq);
    u->master = NULL;
    u->shard_lp = NULL;
    u->grad_shard = NULL;
    u->grad_sq = NULL;
    u->grad_sq_valid = false;
}

static mt_fsdp_root *root_new(mt_fsdp_unit *u) {
    mt_fsdp_root *r = calloc(1, sizeof *r);
    if (r) {
        r->unit = u;
        r->refs = 1;
    }
    return r;
}

/* The model's units changed: the kept views (mt_fsdp_unit_view) are rebuilt when next asked. */
static void views_drop(mt_fsdp_root *r) {
    if (!r) return;
    free(r->views);
    r->views = NULL;
    r->n_views = 0;
}

/* Drops one unit's reference to its root; the last one frees it. */
static void root_release(mt_fsdp_root *r) {
    views_drop(r); /* the unit that lets go leaves the model */
    if (!r || --r->refs > 0) return;
    free(r->order[0].units);
    free(r->order[1].units);
    free(r->broken);
    free(r);
}

static void unit_free_struct(mt_fsdp_unit *u) {
    root_release(u->root);
    free(u->params);
    free(u->offsets);
    free(u->ranges);
    free(u->shard_dim);
    free(u->replicate_dim);
    free(u->fwd_prefetch);
    free(u->bwd_prefetch);
    free(u);
}

/* Fills the master shard from the parameters' own f32 buffers (padding stays 0). A deferred
 * parameter without values has none: its range stays 0 until an initialiser or a checkpoint
 * load writes it there. */
static mt_status fill_master(mt_fsdp_unit *u) {
    size_t lo = (size_t)u->rank * u->S, b, e;
    for (size_t i = 0; i < u->n_params; i++) {
        mt_param *p = u->params[i];
        if (!mt_param_needs_init(p) && shard_overlap(u, i, &b, &e))
            MT_TRY(mt_device_copy(u->dev, u->master + (b - lo),
                                  (const float *)p->data + (b - u->offsets[i]),
                                  (e - b) * sizeof(float),
                                  u->offload ? MT_COPY_DEVICE_TO_HOST : MT_COPY_DEVICE_TO_DEVICE,
                                  NULL));
    }
    return MT_OK;
}

static mt_status alloc_shards(mt_fsdp_unit *u) {
    if (u->offload) return mt_fsdp_offload_alloc(u);
    size_t S = u->S;
    mt_mem_category master_cat = u->param_dtype == MT_F32 ? MT_MEM_PARAMS : MT_MEM_OPTIMIZER;
    MT_TRY(mt_device_alloc(u->dev, S * sizeof(float), master_cat, (void **)&u->master));
    MT_TRY(mt_device_alloc(u->dev, S * sizeof(float), MT_MEM_GRADS, (void **)&u->grad_shard));
    MT_TRY(mt_device_memset(u->dev, u->master, 0, S * sizeof(float), NULL));
    MT_TRY(mt_device_memset(u->dev, u->grad_shard, 0, S * sizeof(float), NULL));
    u->grad_shard_zero = true;
    if (u->param_dtype == MT_BF16)
        MT_TRY(mt_device_alloc(u->dev, S * sizeof(mt_bf16), MT_MEM_PARAMS, (void **)&u->shard_lp));
    return MT_OK;
}

/* The tp group and coordinate of the module's tp dimension, when the mesh has one. */
static mt_status resolve_tp(mt_fsdp_unit *u, mt_module *module) {
    int tpd = mt_mesh_dim_index(module->mesh, module->tp_dim);
    if (tpd < 0) return MT_OK;
    MT_TRY(mt_mesh_group(module->mesh, module->tp_dim, &u->tp));
    u->tp_rank = mt_mesh_coord(module->mesh, tpd);
    return MT_OK;
}

/* Lays the parameters out in the flat buffer and builds this rank's shard of it. */
static mt_status build_shard(mt_fsdp_unit *u) {
    u->offsets = calloc(u->n_params ? u->n_params : 1, sizeof *u->offsets);
    if (!u->offsets) return mt_error(MT_ERR_OUT_OF_MEMORY, "out of host memory");
    for (size_t i = 0; i < u->n_params; i++) {
        u->offsets[i] = u->total;
        u->total += u->params[i]->numel;
    }
    size_t N = (size_t)u->nranks;
    u->padded = (u->total + N - 1) / N * N;
    u->S = u->padded / N;
    size_t mapped_S = u->map_wanted ? mt_fsdp_mapped_shard(u->total, u->nranks) : 0;
    u->map_wanted = mapped_S > 0;
    if (u->map_wanted) {
        u->S = mapped_S;
        u->padded = mapped_S * N;
    }
    MT_TRY(alloc_shards(u));
    MT_TRY(build_ranges(u));
    MT_TRY(fill_master(u));
    if (u->offload) return mt_fsdp_offload_refresh(u);
    if (u->shard_lp) MT_TRY(mt_op_cast(u->dev, u->master, MT_F32, u->shard_lp, MT_BF16, u->S));
    return MT_OK;
}

/* After an initialiser wrote a parameter's part of the master shard: its bf16 copy. */
static mt_status held_written(mt_param *p, void *ctx) {
    mt_fsdp_unit *u = ctx;
    size_t at = (size_t)(p->held - u->master);
    if (u->offload) return mt_fsdp_offload_written(u, at, at + (p->held_end - p->held_begin));
    if (!u->shard_lp) return MT_OK;
    return mt_op_cast(u->dev, p->held, MT_F32, u->shard_lp + at, MT_BF16,
                      p->held_end - p->held_begin);
}

/* From here on the shard holds the parameters' values: tell each one which of its elements this
 * rank holds, so that initialisers (module/param_init.c) write them there. */
static void hold_params(mt_fsdp_unit *u) {
    size_t lo = (size_t)u->rank * u->S, b, e;
    for (size_t i = 0; i < u->n_params; i++) {
        mt_param *p = u->params[i];
        p->held_by = "an FSDP unit";
        p->held_written = held_written;
        p->held_ctx = u;
        p->held = u->master;
        p->held_begin = p->held_end = 0;
        if (!shard_overlap(u, i, &b, &e)) continue;
        p->held = u->master + (b - lo);
        p->held_begin = b - u->offsets[i];
        p->held_end = e - u->offsets[i];
    }
}

/* The new unit u is its model's outermost: the units below, each outermost until now, share
 * its root from here on. */
static void adopt_units_below(mt_fsdp_unit *u, mt_fsdp_unit **below, size_t n) {
    for (size_t i = 0; i < n; i++) {
        root_release(below[i]->root);
        below[i]->root = u->root;
        u->root->refs++;
    }
}

size_t mt_fsdp_mapped_shard(size_t total, int nranks) {
    size_t N = (size_t)nranks, S = (total + N - 1) / N;
    if (nranks < 2 || S * sizeof(float) < MT_SHM_BLOCK_MIN_BYTES) return 0;
    long page = sysconf(_SC_PAGESIZE);
    size_t per_page = page > 0 ? (size_t)page / sizeof(float) : 1024;
    return (S + per_page - 1) / per_page * per_page;
}

/* Collective over the shard group, right after the shards exist: the view of every rank's
 * master shard, when the unit qualified and every rank can map (else gathers copy). */
static mt_status map_shards(mt_fsdp_unit *u) {
    if (!u->map_wanted) return MT_OK;
    char why[256] = "", desc[256];
    MT_TRY(mt_shm_view_map(u->shard, u->master, u->S * sizeof(float), &u->view, why,
                           sizeof why));
    if (!u->view)
        mt_log(MT_LOG_DEBUG, "fsdp: %s gathers by copying: %s",
               mt_fsdp_unit_desc(u, desc, sizeof desc), why);
    return MT_OK;
}

mt_status mt_fsdp_shard(mt_module *module, const mt_fsdp_options *options) {
    if (!module || !options)
        return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_shard: module and options are required");
    mt_group *shard, *replicate;
    MT_TRY(check_options(module, options, &shard, &replicate));

    mt_fsdp_unit *u = calloc(1, sizeof *u);
    if (!u) return mt_error(MT_ERR_OUT_OF_MEMORY, "mt_fsdp_shard('%s'): out of host memory",
                            module->name);
    u->module = module;
    u->dev = module->dev;
    u->grad_scale = 1.0f;
    u->shard = shard;
    u->replicate = replicate;
    u->reshard_after_forward = options->reshard_after_forward;
    u->param_dtype = options->param_dtype;
    u->reduce_dtype = options->reduce_dtype;
    u->shard_dim = dup_opt(options->shard_dim);
    u->replicate_dim = dup_opt(options->replicate_dim);
    u->nranks = mt_group_size(shard);
    u->rank = mt_group_rank(shard);
    u->requires_sync = true;
    u->prefetch_enabled = true;
    u->root = root_new(u);
    mt_status st = resolve_tp(u, module);
    if (st == MT_OK) st = mt_fsdp_offload_setup(u, options);
    u->map_wanted = options->mapped_gather && u->nranks > 1 && u->param_dtype == MT_F32 &&
                    u->offload == MT_OFFLOAD_NONE &&
                    mt_device_get_kind(u->dev) == MT_DEVICE_CPU;
    ptr_list params = {0};
    mt_fsdp_unit **below = NULL;
    size_t n_below = 0;
    if (st == MT_OK && (!u->root || !u->shard_dim ||
                        (options->replicate_dim && !u->replicate_dim) ||
                        !collect_params(module, true, &params)))
        st = mt_error(MT_ERR_OUT_OF_MEMORY, "out of host memory");
    u->params = (mt_param **)params.items;
    u->n_params = params.n;
    if (st == MT_OK) st = mt_fsdp_check_ranks_agree(u);
    if (st == MT_OK) st = build_shard(u);
    if (st == MT_OK) st = map_shards(u);
    if (st == MT_OK) st = mt_fsdp_units_below(module, &below, &n_below);
    if (st == MT_OK) st = mt_module_add_hooks(module, &mt_fsdp_hooks, &mt_fsdp_hooks, u);
    if (st != MT_OK) {
        free(below);
        free_buffers(u);
        unit_free_struct(u);
        return mt_error_wrap(st, "mt_fsdp_shard('%s')", module->name);
    }
    adopt_units_below(u, below, n_below);
    free(below);
    /* The per-parameter buffers go: from here on the shard is the only copy. */
    for (size_t i = 0; i < u->n_params; i++) {
        mt_param *p = u->params[i];
        mt_device_free(u->dev, p->data);
        p->data = NULL;
        p->own_data = false;
        p->dtype = u->param_dtype;
    }
    hold_params(u);
    mt_module_seal(module, "an FSDP unit", "build the whole model before sharding");
    mt_log(MT_LOG_DEBUG, "fsdp: unit '%s': %zu params, %zu elements, padded to %zu, shard %zu "
           "(%d ranks on '%s'%s%s), param %s, reduce %s", module->name, u->n_params, u->total,
           u->padded, u->S, u->nranks, u->shard_dim, u->replicate_dim ? ", replicated on " : "",
           u->replicate_dim ? u->replicate_dim : "", mt_dtype_name(u->param_dtype),
           mt_dtype_name(u->reduce_dtype));
    return MT_OK;
}

/* ---- unshard / reshard ------------------------------------------------------------------- */

static void point_params(mt_fsdp_unit *u, bool unsharded) {
    size_t es = mt_dtype_size(u->param_dtype);
    for (size_t i = 0; i < u->n_params; i++) {
        mt_param *p = u->params[i];
        p->data = unsharded ? (char *)u->full + u->offsets[i] * es : NULL;
    }
}

/* MT_OK unless a deferred parameter of u has no values yet (mt_param_check_ready). */
static mt_status check_unit_ready(const mt_fsdp_unit *u, const char *what) {
    for (size_t i = 0; i < u->n_params; i++) MT_TRY(mt_param_check_ready(u->params[i], what));
    return MT_OK;
}

bool mt_fsdp_gather_aliases(const mt_fsdp_unit *u) {
    return u->nranks == 1 && u->param_dtype == MT_F32 && u->offload == MT_OFFLOAD_NONE;
}

/* The full buffer goes, unless it is the master shard itself (mt_fsdp_gather_aliases) or the
 * mapped view of every rank's (kept for the unit's life). */
static void release_full(mt_fsdp_unit *u) {
    if (u->full != (void *)u->master && u->full != u->view) mt_device_free(u->dev, u->full);
    u->full = NULL;
}

mt_status mt_fsdp_unshard_issue(mt_fsdp_unit *u) {
    if (u->state != MT_UNIT_SHARDED) return MT_OK;
    char desc[256];
    MT_TRY(check_unit_ready(u, "gathering its FSDP unit"));
    if (mt_fsdp_gather_aliases(u)) {
        /* The one rank's shard is the whole flat buffer: the parameters point into the master
         * shard itself. An all-gather over one rank would copy the whole unit into a second
         * buffer every time (the full model twice a step), for the same values. Counted as a
         * gather: the unit was unsharded. */
        u->full = u->master;
        u->debug.all_gathers++;
        u->state = MT_UNIT_GATHERING;
        return MT_OK;
    }
    if (u->view) {
        /* Every rank's shard is mapped here already; what the gather must still give is the
         * values of the last optimizer step on every rank. A rank arrives here only after its
         * step wrote its shard (and a shard is written only once the unit's reduce-scatter
         * completed, which needs every rank's backward of the unit: no rank reads the unit
         * then), so a barrier is the whole gather. */
        mt_status st = mt_barrier(u->shard, &u->ag_work);
        if (st != MT_OK)
            return mt_error_wrap(st, "gather (barrier) of %s over '%s'",
                                 mt_fsdp_unit_desc(u, desc, sizeof desc), u->shard_dim);
        u->full = u->view;
        u->debug.all_gathers++;
        u->debug.mapped_gathers++;
        u->state = MT_UNIT_GATHERING;
        return MT_OK;
    }
    size_t es = mt_dtype_size(u->param_dtype);
    mt_status st = mt_device_alloc(u->dev, u->padded * es, MT_MEM_PARAMS, &u->full);
    if (st != MT_OK)
        return mt_error_wrap(st, "unsharding %s", mt_fsdp_unit_desc(u, desc, sizeof desc));
    u->debug.all_gathers++;
    if (u->S > 0) {
        const void *send = u->param_dtype == MT_BF16 ? (const void *)u->shard_lp : u->master;
        if (u->offload) st = mt_fsdp_offload_stage_in(u, &send);
        if (st == MT_OK)
            st = mt_all_gather(u->shard, send, u->full, u->S, u->param_dtype, &u->ag_work);
        if (st != MT_OK) {
            st = mt_fsdp_offload_gathered_after(u, st);
            release_full(u);
            u->ag_work = NULL;
            return mt_error_wrap(st, "all-gather of %s over '%s'",
                                 mt_fsdp_unit_desc(u, desc, sizeof desc), u->shard_dim);
        }
    }
    u->state = MT_UNIT_GATHERING;
    return MT_OK;
}

/* Waits for the all-gather in flight; on failure the full buffer is released. */
static mt_status finish_gather(mt_fsdp_unit *u) {
    mt_status st = MT_OK;
    if (u->ag_work) {
        double t0 = mt_clock_now_s();
        st = mt_work_wait(u->ag_work, -1);
        u->debug.wait_s += mt_clock_now_s() - t0;
        mt_work_free(u->ag_work);
        u->ag_work = NULL;
    }
    st = st == MT_OK ? mt_fsdp_offload_gathered(u) : mt_fsdp_offload_gathered_after(u, st);
    if (st != MT_OK) {
        char desc[256];
        mt_error_wrap(st, "all-gather of %s over '%s'", mt_fsdp_unit_desc(u, desc, sizeof desc),
                      u->shard_dim);
        release_full(u);
        u->state = MT_UNIT_SHARDED;
        return st;
    }
    u->state = MT_UNIT_UNSHARDED;
    return MT_OK;
}

mt_status mt_fsdp_unshard_wait(mt_fsdp_unit *u) {
    MT_TRY(mt_fsdp_unshard_issue(u));
    if (u->state == MT_UNIT_GATHERING) MT_TRY(finish_gather(u));
    point_params(u, true);
    return MT_OK;
}

mt_status mt_fsdp_reshard(mt_fsdp_unit *u) {
    mt_status st = MT_OK;
    if (u->state == MT_UNIT_GATHERING) st = finish_gather(u);
    point_params(u, false);
    release_full(u);
    u->state = MT_UNIT_SHARDED;
    return st;
}

void mt_fsdp_unit_destroy(mt_module *module, void *unit) {
    (void)module;
    mt_fsdp_unit *u = unit;
    if (!u) return;
    if (u->ag_work) mt_work_free(u->ag_work);
    if (u->rs_work) mt_work_free(u->rs_work);
    u->ag_work = u->rs_work = NULL;
    /* An outermost unit may point at a unit below with a reduce-scatter pending: its buffers are
     * released by that unit's own destroy, after its work handle was freed above or there. */
    release_full(u);
    if (!u->grad_aliased) mt_device_free(u->dev, u->full_grad);
    mt_device_free(u->dev, u->rs_send);
    if (!u->rs_in_shard) mt_device_free(u->dev, u->rs_recv);
    free_buffers(u);
    for (size_t i = 0; i < u->n_params; i++) {
        mt_param *p = u->params[i];
        p->data = NULL;
        p->grad = NULL;
        p->dtype = MT_F32;
        p->held_by = NULL;
        p->held = NULL;
        p->held_written = NULL;
        p->held_ctx = NULL;
        p->held_begin = p->held_end = 0;
    }
    /* No unit above can still point at this one (rs_pending, prefetch lists, recorded order):
     * mt_module_destroy releases a module's hooks (its unit) before its children, and detaches
     * them; the root struct goes with the last unit pointing to it. */
    unit_free_struct(u);
}

/* ---- what optimizer and clipping see ----------------------------------------------------- */

static mt_status root_unit(mt_module *root, const char *what, mt_fsdp_unit **out) {
    *out = mt_fsdp_unit_of(root);
    if (!*out)
        return mt_error(MT_ERR_INVALID_ARG, "%s: module '%s' is not an FSDP unit (call "
                        "mt_fsdp_shard on it first)", what, root ? root->name : "(null)");
    return MT_OK;
}

/* Every unit of root's model (root must be a unit), as mt_fsdp_units_below lists them. */
static mt_status root_units(mt_module *root, const char *what, mt_fsdp_unit ***units,
                            size_t *count) {
    mt_fsdp_unit *ru;
    MT_TRY(root_unit(root, what, &ru));
    return mt_fsdp_units_below(root, units, count);
}

static void fill_view(const mt_fsdp_unit *u, mt_fsdp_shard_view *v) {
    v->unit_name = u->module->name;
    v->param = u->master;
    v->grad = u->grad_shard;
    v->n = u->S;
    v->ranges = u->ranges;
    v->n_ranges = u->n_ranges;
    v->host = u->offload != MT_OFFLOAD_NONE;
    v->grad_scale = u->grad_scale; /* 1 once written (mt_fsdp_grad_shard_ready) */
    v->grad_sq = u->grad_sq_valid ? u->grad_sq : NULL;
}

mt_status mt_fsdp_unit_view(mt_fsdp_unit *u, const mt_fsdp_shard_view **view, size_t *index,
                            size_t *count) {
    mt_fsdp_root *r = u->root;
    if (!r->views) {
        mt_fsdp_unit **units;
        size_t n;
        MT_TRY(mt_fsdp_units_below(r->unit->module, &units, &n));
        mt_fsdp_shard_view *v = calloc(n ? n : 1, sizeof *v);
        if (!v) {
            free(units);
            return mt_error(MT_ERR_OUT_OF_MEMORY, "fsdp: out of host memory for the shard views "
                            "of the %zu units of '%s'", n, r->unit->module->name);
        }
        for (size_t i = 0; i < n; i++) {
            fill_view(units[i], &v[i]);
            v[i].grad_sq = NULL; /* kept past the landing that made them valid */
            units[i]->view_index = i;
        }
        free(units);
        r->views = v;
        r->n_views = n;
    }
    if (u->view_index >= r->n_views || r->views[u->view_index].unit_name != u->module->name)
        return mt_error(MT_ERR_INTERNAL, "fsdp: unit '%s' is not among the %zu units below '%s' "
                        "(the kept shard views were not rebuilt after the model changed)",
                        u->module->name, r->n_views, r->unit->module->name);
    *view = &r->views[u->view_index];
    *index = u->view_index;
    *count = r->n_views;
    return MT_OK;
}

/* defer_scale: a deferred clipping factor stays in the view (mt_fsdp_collect_shards_for_step). */
static mt_status collect_shards(mt_module *root, mt_fsdp_shard_view **views, size_t *n,
                                bool defer_scale) {
    if (!views || !n) return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_collect_shards: NULL output");
    mt_fsdp_unit **units;
    size_t count;
    MT_TRY(root_units(root, "mt_fsdp_collect_shards", &units, &count));
    /* The views are read as complete gradients: a copy still in flight on the device lands
     * first (normally the end of the backward did it already). */
    mt_status landed = count ? mt_fsdp_offload_grads_landed(units[0]) : MT_OK;
    if (landed != MT_OK) {
        free(units);
        return mt_error_wrap(landed, "mt_fsdp_collect_shards: landing the last gradient copy");
    }
    mt_fsdp_shard_view *v = calloc(count ? count : 1, sizeof *v);
    if (!v) {
        free(units);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "mt_fsdp_collect_shards: out of host memory");
    }
    for (size_t i = 0; i < count; i++) {
        /* The caller writes the masters (optimizer step): a refresh copy reading them ends first. */
        mt_status q = mt_fsdp_offload_quiesce(units[i]);
        if (q != MT_OK) {
            free(v);
            free(units);
            return mt_error_wrap(q, "mt_fsdp_collect_shards: the parameter copy of unit '%s'",
                                 units[i]->module->name);
        }
        /* The optimizer and clipping read the gradient: a lazily zeroed one gets its zeros, a
         * deferred clipping factor is applied (unless the reader applies it). */
        bool deferred = defer_scale && units[i]->grad_scale != 1.0f;
        q = deferred ? MT_OK : mt_fsdp_grad_shard_ready(units[i]);
        if (q != MT_OK) {
            free(v);
            free(units);
            return mt_error_wrap(q, "mt_fsdp_collect_shards: writing the gradient of unit '%s'",
                                 units[i]->module->name);
        }
        fill_view(units[i], &v[i]);
    }
    free(units);
    *views = v;
    *n = count;
    return MT_OK;
}

mt_status mt_fsdp_collect_shards(mt_module *root, mt_fsdp_shard_view **views, size_t *n) {
    return collect_shards(root, views, n, false);
}

mt_status mt_fsdp_collect_shards_for_step(mt_module *root, mt_fsdp_shard_view **views,
                                          size_t *n) {
    return collect_shards(root, views, n, true);
}

mt_status mt_fsdp_scale_grads(mt_module *root, float c) {
    mt_fsdp_unit **units;
    size_t count;
    MT_TRY(root_units(root, "clip_grad_norm", &units, &count));
    mt_status st = MT_OK;
    for (size_t i = 0; i < count && st == MT_OK; i++) {
        mt_fsdp_unit *u = units[i];
        u->grad_sq_valid = false; /* of the values before the factor */
        /* Each scaling is one rounding of the values written so far: an earlier factor first. */
        st = mt_fsdp_grad_shard_ready(u);
        bool cpu = mt_device_get_kind(u->dev) == MT_DEVICE_CPU;
        if (st == MT_OK && u->offload) { /* host tier: host memory on every backend */
            st = mt_cpu_op_scale(u->grad_shard, c, u->S);
        } else if (st == MT_OK && cpu && c > 0.0f) {
            if (!u->grad_shard_zero) u->grad_scale = c;
        } else if (st == MT_OK) {
            st = mt_op_scale(u->dev, u->grad_shard, c, u->S);
        }
        if (st != MT_OK)
            mt_error_wrap(st, "clip_grad_norm: scaling the gradients of unit '%s'",
                          u->module->name);
    }
    free(units);
    return st;
}

mt_status mt_fsdp_groups(mt_module *root, mt_group **shard, mt_group **replicate, mt_group **tp,
                         int *tp_rank) {
    mt_fsdp_unit *u = NULL;
    MT_TRY(root_unit(root, "mt_fsdp_groups", &u));
    if (shard) *shard = u->shard;
    if (replicate) *replicate = u->replicate;
    if (tp) *tp = u->tp;
    if (tp_rank) *tp_rank = u->tp_rank;
    return MT_OK;
}

mt_status mt_fsdp_shards_updated(mt_module *root) {
    mt_fsdp_unit **units;
    size_t count;
    MT_TRY(root_units(root, "mt_fsdp_shards_updated", &units, &count));
    mt_status st = MT_OK;
    for (size_t i = 0; i < count; i++) {
        mt_fsdp_unit *u = units[i];
        if (u->offload) {
            mt_status s = mt_fsdp_offload_refresh(u);
            if (st == MT_OK) st = s;
        } else if (u->shard_lp) {
            mt_status s = mt_op_cast(u->dev, u->master, MT_F32, u->shard_lp, MT_BF16, u->S);
            if (st == MT_OK) st = s;
        }
        /* A unit left unsharded (no reshard after forward) holds the old values. */
        if (u->state != MT_UNIT_SHARDED && !u->in_backward) {
            mt_status s = mt_fsdp_reshard(u);
            if (st == MT_OK) st = s;
        }
    }
    free(units);
    return st;
}

mt_status mt_fsdp_check_initialised(mt_module *root, const char *what) {
    mt_fsdp_unit **units;
    size_t count;
    MT_TRY(root_units(root, what, &units, &count));
    mt_status st = MT_OK;
    for (size_t i = 0; i < count && st == MT_OK; i++) st = check_unit_ready(units[i], what);
    free(units);
    return st;
}

mt_status mt_fsdp_mark_loaded(mt_module *root) {
    mt_fsdp_unit **units;
    size_t count;
    MT_TRY(root_units(root, "mt_fsdp_mark_loaded", &units, &count));
    for (size_t i = 0; i < count; i++)
        for (size_t j = 0; j < units[i]->n_params; j++)
            if (units[i]->params[j]->deferred) units[i]->params[j]->initialised = true;
    free(units);
    return MT_OK;
}

mt_device *mt_fsdp_device(mt_module *root) { return root ? root->dev : NULL; }

mt_status mt_fsdp_set_grad_landed(mt_module *root, mt_fsdp_grad_landed_fn fn,
                                  mt_fsdp_pass_begin_fn begin, void *arg) {
    mt_fsdp_unit *u;
    MT_TRY(root_unit(root, "mt_fsdp_set_grad_landed", &u));
    u->root->grad_landed = fn;
    u->root->pass_begin = fn ? begin : NULL;
    u->root->grad_landed_arg = fn ? arg : NULL;
    return MT_OK;
}

bool mt_fsdp_grad_landed_installed(mt_module *root) {
    mt_fsdp_unit *u = mt_fsdp_unit_of(root);
    return u && u->root && u->root->grad_landed;
}

mt_status mt_fsdp_grad_shard_ready(mt_fsdp_unit *u) {
    if (u->grad_shard_lazy || u->grad_scale != 1.0f) u->grad_sq_valid = false;
    if (u->grad_shard_lazy) {
        MT_TRY(mt_device_memset(u->dev, u->grad_shard, 0, u->S * sizeof(float), NULL));
        u->grad_shard_lazy = false;
    } else if (u->grad_scale != 1.0f) {
        MT_TRY(mt_op_scale(u->dev, u->grad_shard, u->grad_scale, u->S));
        u->grad_scale = 1.0f;
    }
    return MT_OK;
}

mt_status mt_zero_grad(mt_module *root) {
    mt_fsdp_unit **units;
    size_t count;
    MT_TRY(root_units(root, "mt_zero_grad", &units, &count));
    /* A gradient copy still in flight would otherwise be added after the zeroing. */
    mt_status st = count ? mt_fsdp_offload_grads_landed(units[0]) : MT_OK;
    for (size_t i = 0; i < count && st == MT_OK; i++) {
        mt_fsdp_unit *u = units[i];
        u->grad_sq_valid = false;
        if (u->offload) /* host tier: host memory on every backend */
            memset(u->grad_shard, 0, u->S * sizeof(float));
        else if (mt_device_get_kind(u->dev) == MT_DEVICE_CPU)
            /* The next synchronising backward overwrites the whole shard (a reduce-scatter into
             * it, or at one rank its first writers): a memset of it every step (the model's
             * size / ranks, 25 ms of a 0.8 s step at one rank) would be written over unread. On
             * a GPU the aliased backward adds into zeros, and the memset is one launch. */
            u->grad_shard_lazy = true;
        else
            st = mt_device_memset(u->dev, u->grad_shard, 0, u->S * sizeof(float), NULL);
        if (st == MT_OK) {
            u->grad_shard_zero = true;
            u->grad_scale = 1.0f;
        }
    }
    free(units);
    return st;
}

/* ---- switches ---------------------------------------------------------------------------- */

/* The units a switch named what applies to: every unit at or below module, at least one. */
static mt_status switch_units(mt_module *module, const char *what, mt_fsdp_unit ***units,
                              size_t *count) {
    if (!module) return mt_error(MT_ERR_INVALID_ARG, "%s: NULL module", what);
    MT_TRY(mt_fsdp_units_below(module, units, count));
    if (*count > 0) return MT_OK;
    free(*units);
    return mt_error(MT_ERR_INVALID_ARG, "%s: no FSDP unit at or below module '%s'", what,
                    module->name);
}

mt_status mt_fsdp_set_requires_gradient_sync(mt_module *module, bool sync) {
    mt_fsdp_unit **units;
    size_t count;
    MT_TRY(switch_units(module, "mt_fsdp_set_requires_gradient_sync", &units, &count));
    for (size_t i = 0; i < count; i++) units[i]->requires_sync = sync;
    free(units);
    return MT_OK;
}

mt_status mt_fsdp_set_prefetch(mt_module *root, bool enabled) {
    mt_fsdp_unit **units;
    size_t count;
    MT_TRY(switch_units(root, "mt_fsdp_set_prefetch", &units, &count));
    for (size_t i = 0; i < count; i++) units[i]->prefetch_enabled = enabled;
    free(units);
    return MT_OK;
}

static mt_status set_prefetch_list(mt_module *unit, mt_module *const *units, int n, bool bwd) {
    const char *what = bwd ? "mt_fsdp_set_backward_prefetch" : "mt_fsdp_set_forward_prefetch";
    mt_fsdp_unit *u = mt_fsdp_unit_of(unit);
    if (!u)
        return mt_error(MT_ERR_INVALID_ARG, "%s: module '%s' is not an FSDP unit", what,
                        unit ? unit->name : "(null)");
    if (n < 0 || (n > 0 && !units))
        return mt_error(MT_ERR_INVALID_ARG, "%s('%s'): bad list", what, unit->name);
    mt_fsdp_unit **list = calloc(n > 0 ? (size_t)n : 1, sizeof *list);
    if (!list) return mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of host memory", what);
    for (int i = 0; i < n; i++) {
        list[i] = mt_fsdp_unit_of(units[i]);
        if (!list[i] || list[i]->root != u->root) {
            free(list);
            return mt_error(MT_ERR_INVALID_ARG, "%s('%s'): entry %d ('%s') is not an FSDP unit "
                            "of the same model", what, unit->name, i,
                            units[i] ? units[i]->name : "(null)");
        }
    }
    if (bwd) {
        free(u->bwd_prefetch);
        u->bwd_prefetch = list;
        u->n_bwd_prefetch = n;
        u->bwd_explicit = true;
    } else {
        free(u->fwd_prefetch);
        u->fwd_prefetch = list;
        u->n_fwd_prefetch = n;
        u->fwd_explicit = true;
    }
    return MT_OK;
}

mt_status mt_fsdp_set_forward_prefetch(mt_module *unit, mt_module *const *units, int n) {
    return set_prefetch_list(unit, units, n, false);
}

mt_status mt_fsdp_set_backward_prefetch(mt_module *unit, mt_module *const *units, int n) {
    return set_prefetch_list(unit, units, n, true);
}

/* ---- test hooks -------------------------------------------------------------------------- */

mt_status mt_fsdp_debug_get(mt_module *module, mt_fsdp_debug *out) {
    mt_fsdp_unit *u = mt_fsdp_unit_of(module);
    if (!u || !out) return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_debug_get: not an FSDP unit");
    *out = u->debug;
    out->max_outstanding_rs = mt_fsdp_is_outermost(u) ? u->root->max_outstanding_rs : 0;
    return MT_OK;
}

mt_status mt_fsdp_debug_order(mt_module *root, bool backward, mt_module **out, size_t cap,
                              size_t *n) {
    mt_fsdp_unit *o = mt_fsdp_outermost(root);
    if (!o || !n) return mt_error(MT_ERR_INVALID_ARG, "mt_fsdp_debug_order: not an FSDP unit");
    const mt_fsdp_order *order = &o->root->order[backward];
    *n = order->recorded ? order->n : 0;
    for (size_t i = 0; i < *n && i < cap; i++) out[i] = order->units[i]->module;
    return MT_OK;
}
