/* Load with resharding (include/meshtrain/checkpoint.h).
 *
 * Every rank reads metadata.json, checks it against its live model (names, global shapes, the
 * optimizer's state, the extras asked for), then reads what its own shards need: for each box of
 * its shard range (checkpoint/layout.h) the saved chunks of that tensor that intersect it,
 * checksums verified, into host buffers. Only when every rank has succeeded (one all-gather of
 * the outcomes) are the buffers copied into the model, the optimizer and the extras; otherwise
 * every rank returns the first failing rank's message and nothing was changed. */
#include "checkpoint/ckpt_fs.h"
#include "checkpoint/ckpt_meta.h"
#include "checkpoint/ckpt_plan.h"
#include "checkpoint/ckpt_save.h"
#include "checkpoint/ckpt_stage.h"
#include "core/error.h"
#include "fsdp/fsdp_offload.h"

#include <meshtrain/checkpoint.h>
#include <meshtrain/comm.h>
#include <meshtrain/mesh.h>
#include <meshtrain/runtime.h>
#include <meshtrain/store.h>

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A few chunks read recently: a rank's boxes of one tensor (at most a handful) often need the
 * same saved chunk. */
#define CHUNK_CACHE 4

typedef struct loader {
    mt_ckpt_meta meta;
    mt_ckpt_plan plan;
    mt_ckpt_reader *reader;
    bool load_optimizer;
    float **unit_host[MT_CKPT_KINDS]; /* per kind, per unit: the shard as it will be loaded */
    void **extra_data;
    struct {
        const mt_ckpt_chunk *chunk;
        float *data;
        size_t cap; /* bytes allocated: a slot's buffer is reused (no page faults per chunk) */
    } cache[CHUNK_CACHE];
    int cache_next;
} loader;

static void loader_free(loader *l) {
    for (int k = 0; k < MT_CKPT_KINDS; k++) {
        if (l->unit_host[k])
            for (size_t u = 0; u < l->plan.n_units; u++) free(l->unit_host[k][u]);
        free(l->unit_host[k]);
    }
    for (int i = 0; i < CHUNK_CACHE; i++) free(l->cache[i].data);
    mt_ckpt_reader_close(l->reader);
    mt_ckpt_plan_free(&l->plan);
    mt_ckpt_meta_free(&l->meta);
}

/* The checkpoint's tensors against the model's: the same names and global shapes. */
static mt_status check_tensors(loader *l) {
    const mt_ckpt_meta *m = &l->meta;
    int kinds = l->load_optimizer ? MT_CKPT_KINDS : 1;
    size_t expected[MT_CKPT_KINDS] = {0};
    for (size_t i = 0; i < l->plan.n_params; i++)
        for (int k = 0; k < kinds; k++) {
            char name[1024];
            mt_ckpt_tensor_name(&l->plan, i, (mt_ckpt_kind)k, name, sizeof name);
            const mt_ckpt_tensor_meta *t = mt_ckpt_meta_tensor(m, name);
            const mt_ckpt_param_layout *p = &l->plan.params[i].layout;
            if (!t)
                return mt_error(MT_ERR_MISMATCH, "checkpoint '%s' has no tensor '%s', which the "
                                "model has (a checkpoint of another model?)", m->dir, name);
            const int64_t *shape = l->plan.params[i].shape;
            bool same = t->ndim == p->ndim;
            for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == shape[d];
            if (!same) {
                char a[128], b[128];
                mt_ckpt_dims_text(t->shape, t->ndim, a, sizeof a);
                mt_ckpt_dims_text(shape, p->ndim, b, sizeof b);
                return mt_error(MT_ERR_MISMATCH, "checkpoint '%s': tensor '%s' has shape %s in "
                                "the checkpoint and %s in the model", m->dir, name, a, b);
            }
            expected[k]++;
        }
    /* Every checkpoint tensor of a kind loaded must be one of the model's, and every tensor
     * one of the kinds this build knows. */
    for (size_t i = 0; i < m->n_tensors; i++) {
        const char *name = m->tensors[i].name;
        bool kind_known = false;
        for (int k = 0; k < MT_CKPT_KINDS; k++)
            kind_known |= strncmp(name, mt_ckpt_kind_prefix[k],
                                  strlen(mt_ckpt_kind_prefix[k])) == 0;
        if (!kind_known)
            return mt_error(MT_ERR_MISMATCH, "checkpoint '%s' has tensor '%s', which is neither "
                            "a model value (model/...) nor AdamW state (optim/exp_avg/..., "
                            "optim/exp_avg_sq/...)", m->dir, name);
        for (int k = 0; k < kinds; k++) {
            size_t pl = strlen(mt_ckpt_kind_prefix[k]);
            if (strncmp(name, mt_ckpt_kind_prefix[k], pl) != 0) continue;
            /* "model/" does not prefix "optim/..."; exp_avg/ is not a prefix of exp_avg_sq/. */
            bool known = false;
            for (size_t j = 0; j < l->plan.n_params && !known; j++)
                known = strcmp(name + pl, l->plan.params[j].path) == 0;
            if (!known)
                return mt_error(MT_ERR_MISMATCH, "checkpoint '%s' has tensor '%s', which the "
                                "model does not have (a checkpoint of another model?)", m->dir,
                                name);
        }
    }
    return MT_OK;
}

static mt_status check_extras(loader *l, const mt_checkpoint_extra *ex, int n, int rank,
                              int world) {
    const mt_ckpt_meta *m = &l->meta;
    l->extra_data = calloc((size_t)n + 1, sizeof *l->extra_data);
    if (!l->extra_data) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    for (int i = 0; i < n; i++) {
        const mt_ckpt_extra_meta *e = mt_ckpt_meta_extra(m, ex[i].name);
        if (!e)
            return mt_error(MT_ERR_NOT_FOUND, "checkpoint '%s' has no extra state '%s'", m->dir,
                            ex[i].name);
        if (e->bytes != ex[i].bytes)
            return mt_error(MT_ERR_MISMATCH, "checkpoint '%s': extra '%s' has %" PRIu64 " bytes, "
                            "the program's %zu", m->dir, ex[i].name, e->bytes, ex[i].bytes);
        if (e->per_rank != ex[i].per_rank)
            return mt_error(MT_ERR_MISMATCH, "checkpoint '%s': extra '%s' was saved %s, the "
                            "program loads it %s", m->dir, ex[i].name,
                            e->per_rank ? "per rank" : "once", ex[i].per_rank ? "per rank" : "once");
        const mt_ckpt_chunk *c = NULL;
        if (e->per_rank && m->world_size != world)
            return mt_error(MT_ERR_MISMATCH, "checkpoint '%s': extra '%s' holds each of %d ranks' "
                            "own value; this job has %d ranks", m->dir, ex[i].name,
                            m->world_size, world);
        for (size_t j = 0; j < e->n_chunks && !c; j++)
            if (!e->per_rank || e->chunks[j].rank == rank) c = &e->chunks[j];
        if (!c)
            return mt_error(MT_ERR_IO, "checkpoint '%s': extra '%s' has no value for rank %d",
                            m->dir, ex[i].name, rank);
        l->extra_data[i] = malloc(c->bytes ? c->bytes : 1);
        if (!l->extra_data[i])
            return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
        char what[300];
        snprintf(what, sizeof what, "extra '%s'", ex[i].name);
        MT_TRY(mt_ckpt_read_chunk(l->reader, c, what, l->extra_data[i]));
    }
    return MT_OK;
}

static mt_status chunk_data(loader *l, const mt_ckpt_chunk *c, const char *tensor,
                            const float **out) {
    for (int i = 0; i < CHUNK_CACHE; i++)
        if (l->cache[i].chunk == c) {
            *out = l->cache[i].data;
            return MT_OK;
        }
    int slot = l->cache_next;
    l->cache_next = (l->cache_next + 1) % CHUNK_CACHE;
    l->cache[slot].chunk = NULL;
    if (l->cache[slot].cap < c->bytes || !l->cache[slot].data) {
        free(l->cache[slot].data);
        l->cache[slot].cap = 0;
        l->cache[slot].data = malloc(c->bytes ? c->bytes : 1);
        if (!l->cache[slot].data)
            return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: no memory for a chunk of %" PRIu64
                            " bytes of tensor '%s'", c->bytes, tensor);
        l->cache[slot].cap = c->bytes;
    }
    char what[1100];
    snprintf(what, sizeof what, "tensor '%s'", tensor);
    MT_TRY(mt_ckpt_read_chunk(l->reader, c, what, l->cache[slot].data));
    l->cache[slot].chunk = c;
    *out = l->cache[slot].data;
    return MT_OK;
}

typedef struct fill_ctx {
    loader *l;
    size_t unit;
    mt_ckpt_kind kind;
} fill_ctx;

static bool same_box(const mt_ckpt_chunk *c, int ndim, const mt_ckpt_box *box) {
    for (int d = 0; d < ndim; d++)
        if (c->offsets[d] != box->offset[d] || c->extents[d] != box->extent[d]) return false;
    return true;
}

/* One box of this rank's shard: filled from every saved chunk that intersects it. The box's
 * elements are contiguous in the flat buffer and row-major within the box, so the destination
 * is simply the staging buffer at its flat position, and a chunk that is exactly the box (a load
 * on the dp x tp that saved) is read straight into it. */
static mt_status fill_box(const mt_ckpt_box *box, void *arg) {
    fill_ctx *c = arg;
    loader *l = c->l;
    const mt_ckpt_unit *cu = &l->plan.units[c->unit];
    /* Padding rows are not in the checkpoint: they stay 0. */
    mt_ckpt_box real = *box;
    if (!mt_ckpt_clip_box(&l->plan, cu->first + box->param, &real)) return MT_OK;
    char name[1024];
    mt_ckpt_tensor_name(&l->plan, cu->first + box->param, c->kind, name, sizeof name);
    const mt_ckpt_tensor_meta *t = mt_ckpt_meta_tensor(&l->meta, name);
    float *dst = l->unit_host[c->kind][c->unit] + (box->flat - cu->lo);
    uint64_t filled = 0;
    for (size_t i = 0; i < t->n_chunks; i++) {
        const mt_ckpt_chunk *ch = &t->chunks[i];
        bool meets = true;
        for (int d = 0; d < t->ndim && meets; d++)
            meets = ch->offsets[d] < box->offset[d] + box->extent[d] &&
                    box->offset[d] < ch->offsets[d] + ch->extents[d];
        if (!meets) continue;
        if (same_box(ch, t->ndim, box)) {
            char what[1100];
            snprintf(what, sizeof what, "tensor '%s'", name);
            MT_TRY(mt_ckpt_read_chunk(l->reader, ch, what, dst));
            filled += box->count;
            continue;
        }
        const float *data = NULL;
        MT_TRY(chunk_data(l, ch, name, &data));
        filled += mt_ckpt_copy_intersection(t->ndim, ch, data, box->offset, box->extent, dst);
    }
    if (filled != real.count)
        return mt_error(MT_ERR_IO, "checkpoint '%s': tensor '%s': the chunks cover %" PRIu64
                        " of the %zu elements this rank needs", l->meta.dir, name, filled,
                        real.count);
    return MT_OK;
}

/* Unit by unit and, within a unit, master, m, v: the order save writes them in, so that a load
 * on the same dp x tp reads each file from start to end. */
static mt_status read_shards(loader *l) {
    int kinds = l->load_optimizer ? MT_CKPT_KINDS : 1;
    for (int k = 0; k < kinds; k++) {
        l->unit_host[k] = calloc(l->plan.n_units + 1, sizeof *l->unit_host[k]);
        if (!l->unit_host[k]) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of memory");
    }
    for (size_t u = 0; u < l->plan.n_units; u++)
        for (int k = 0; k < kinds; k++) {
            const mt_ckpt_unit *cu = &l->plan.units[u];
            size_t n = cu->hi - cu->lo;
            /* Zeros: the padding of the last shard stays 0, as FSDP keeps it. */
            l->unit_host[k][u] = calloc(n ? n : 1, sizeof(float));
            if (!l->unit_host[k][u])
                return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: no host memory for %zu "
                                "elements of unit '%s'", n, cu->unit->module->name);
            fill_ctx c = {l, u, (mt_ckpt_kind)k};
            MT_TRY(mt_ckpt_boxes(cu->layouts, cu->count, cu->lo, cu->hi, fill_box, &c));
        }
    return MT_OK;
}

static mt_status read_local(loader *l, mt_module *root, mt_adamw *opt, const char *path,
                            const mt_checkpoint_extra *ex, int n_ex, int rank, int world) {
    char dir[PATH_MAX];
    bool found = false;
    MT_TRY(mt_ckpt_resolve(path, dir, sizeof dir, &found));
    if (!found)
        return mt_error(MT_ERR_NOT_FOUND, "checkpoint: '%s' is neither a checkpoint (no %s) nor a "
                        "folder of checkpoints (no %s)", path, MT_CKPT_META_FILE,
                        MT_CKPT_LATEST_FILE);
    MT_TRY(mt_ckpt_meta_read(dir, &l->meta));
    MT_TRY(mt_ckpt_plan_build(root, opt, &l->plan));
    l->load_optimizer = opt && l->meta.has_optimizer;
    MT_TRY(check_tensors(l));
    MT_TRY(mt_ckpt_reader_open(&l->meta, &l->reader));
    MT_TRY(check_extras(l, ex, n_ex, rank, world));
    return read_shards(l);
}

static mt_status apply(loader *l, mt_module *root, mt_adamw *opt, const mt_checkpoint_extra *ex,
                       int n_ex) {
    int kinds = l->load_optimizer ? MT_CKPT_KINDS : 1;
    /* A unit still gathered from a forward-only pass would keep serving the old values. */
    for (size_t u = 0; u < l->plan.n_units; u++)
        if (l->plan.units[u].unit->state != MT_UNIT_SHARDED)
            MT_TRY(mt_fsdp_reshard(l->plan.units[u].unit));
    for (int k = 0; k < kinds; k++)
        for (size_t u = 0; u < l->plan.n_units; u++) {
            const mt_ckpt_unit *cu = &l->plan.units[u];
            size_t bytes = (cu->hi - cu->lo) * sizeof(float);
            if (cu->host) { /* an offloaded unit's shards are in the host tier */
                /* which a refresh copy to the device may still be reading */
                MT_TRY(mt_fsdp_offload_quiesce(cu->unit));
                memcpy(cu->buf[k], l->unit_host[k][u], bytes);
            } else {
                MT_TRY(mt_device_copy(l->plan.dev, cu->buf[k], l->unit_host[k][u], bytes,
                                      MT_COPY_HOST_TO_DEVICE, NULL));
            }
        }
    if (l->load_optimizer) mt_adamw_set_steps(opt, l->meta.optim_step);
    for (int i = 0; i < n_ex; i++)
        if (ex[i].bytes) memcpy(ex[i].data, l->extra_data[i], ex[i].bytes);
    /* Every shard now holds the checkpoint's values: loading counts as initialising, so a
     * deferred model resumed from a checkpoint never runs its initialisers. */
    MT_TRY(mt_fsdp_mark_loaded(root));
    return mt_fsdp_shards_updated(root); /* the bf16 copies, from the new masters */
}

mt_status mt_checkpoint_load(mt_module *root, mt_adamw *opt, const char *path,
                             const mt_checkpoint_extra *extras, int n_extras,
                             mt_checkpoint_info *info) {
    if (!root || !path || !*path)
        return mt_error(MT_ERR_INVALID_ARG, "mt_checkpoint_load: root and path must be given");
    mt_runtime *rt = mt_mesh_runtime(mt_module_mesh(root));
    int rank = mt_runtime_rank(rt), world = mt_runtime_world_size(rt);
    /* A save in flight reads the shards this load would replace. */
    mt_status st = mt_ckpt_save_wait(root);
    if (st == MT_OK) st = mt_ckpt_check_extras(extras, n_extras);
    loader l;
    memset(&l, 0, sizeof l);
    if (st == MT_OK) st = read_local(&l, root, opt, path, extras, n_extras, rank, world);
    static long loads; /* collective, so the same count on every rank */
    st = mt_ckpt_agree(rt, st, "load", ++loads);
    if (st == MT_OK) {
        st = apply(&l, root, opt, extras, n_extras);
        /* A device copy that fails after the others succeeded leaves this rank's model part old
         * and part new, and the other ranks loaded: nothing can recover that, so the program
         * is failing (its mt_finalize aborts the job instead of waiting). */
        if (st != MT_OK) mt_failure_note(st, mt_last_error());
    }
    if (st == MT_OK && info) {
        info->step = l.meta.step;
        info->has_optimizer = l.meta.has_optimizer;
        snprintf(info->path, sizeof info->path, "%s", l.meta.dir);
    }
    if (l.extra_data)
        for (int i = 0; i < n_extras; i++) free(l.extra_data[i]);
    free(l.extra_data);
    loader_free(&l);
    return st;
}

mt_status mt_checkpoint_resolve(const char *path, char *out, size_t cap, bool *found) {
    if (!out || !found || cap == 0)
        return mt_error(MT_ERR_INVALID_ARG, "mt_checkpoint_resolve: NULL output");
    return mt_ckpt_resolve(path, out, cap, found);
}

mt_status mt_checkpoint_read_extra(const char *path, const char *name, void **data,
                                   size_t *bytes) {
    if (!path || !name || !data || !bytes)
        return mt_error(MT_ERR_INVALID_ARG, "mt_checkpoint_read_extra: NULL argument");
    *data = NULL;
    *bytes = 0;
    char dir[PATH_MAX];
    bool found = false;
    MT_TRY(mt_ckpt_resolve(path, dir, sizeof dir, &found));
    if (!found)
        return mt_error(MT_ERR_NOT_FOUND, "checkpoint: '%s' holds no checkpoint", path);
    mt_ckpt_meta m;
    MT_TRY(mt_ckpt_meta_read(dir, &m));
    const mt_ckpt_extra_meta *e = mt_ckpt_meta_extra(&m, name);
    mt_status st = MT_OK;
    mt_ckpt_reader *r = NULL;
    void *buf = NULL;
    if (!e)
        st = mt_error(MT_ERR_NOT_FOUND, "checkpoint '%s' has no extra state '%s'", dir, name);
    else if (e->per_rank)
        st = mt_error(MT_ERR_INVALID_ARG, "checkpoint '%s': extra '%s' is per rank: load it "
                      "with mt_checkpoint_load", dir, name);
    if (st == MT_OK) st = mt_ckpt_reader_open(&m, &r);
    if (st == MT_OK && !(buf = malloc(e->bytes + 1)))
        st = mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    if (st == MT_OK) {
        char what[300];
        snprintf(what, sizeof what, "extra '%s'", name);
        st = mt_ckpt_read_chunk(r, &e->chunks[0], what, buf);
    }
    if (st == MT_OK) {
        ((char *)buf)[e->bytes] = '\0';
        *data = buf;
        *bytes = e->bytes;
    } else {
        free(buf);
    }
    mt_ckpt_reader_close(r);
    mt_ckpt_meta_free(&m);
    return st;
}
