/* Staging a rank's part of a checkpoint (checkpoint/ckpt_stage.h). */
#include "checkpoint/ckpt_stage.h"

#include "core/copy_stream.h"
#include "core/error.h"
#include "core/staging.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct box_ctx {
    mt_ckpt_stage *st;
    const mt_ckpt_plan *plan;
    size_t unit;
    mt_ckpt_kind kind;
} box_ctx;

static mt_status add_piece(mt_ckpt_stage *st, mt_ckpt_piece **out) {
    if (st->n_pieces == st->cap_pieces) {
        size_t ncap = st->cap_pieces ? 2 * st->cap_pieces : 64;
        mt_ckpt_piece *grown = realloc(st->pieces, ncap * sizeof *grown);
        if (!grown) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
        st->pieces = grown;
        st->cap_pieces = ncap;
    }
    mt_ckpt_piece *p = &st->pieces[st->n_pieces++];
    memset(p, 0, sizeof *p);
    p->offset = st->len;
    *out = p;
    return MT_OK;
}

/* Whether this rank writes box `whole` of unit `unit`: then *box is its real (clipped) part and
 * *param the plan's index of its parameter. Shared by the planning and the copying walks, which
 * must agree box for box. */
static bool written_box(const mt_ckpt_plan *plan, size_t unit, const mt_ckpt_box *whole,
                        mt_ckpt_box *box, size_t *param) {
    *param = plan->units[unit].first + whole->param;
    *box = *whole;
    return mt_ckpt_plan_writes(plan, *param) && mt_ckpt_clip_box(plan, *param, box);
}

static mt_status on_box(const mt_ckpt_box *whole, void *arg) {
    box_ctx *c = arg;
    size_t param;
    mt_ckpt_box clipped, *box = &clipped;
    if (!written_box(c->plan, c->unit, whole, box, &param)) return MT_OK;
    mt_ckpt_piece *p;
    MT_TRY(add_piece(c->st, &p));
    char name[1024];
    p->name = strdup(mt_ckpt_tensor_name(c->plan, param, c->kind, name, sizeof name));
    if (!p->name) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    p->ndim = box->ndim;
    memcpy(p->offsets, box->offset, sizeof p->offsets);
    memcpy(p->extents, box->extent, sizeof p->extents);
    p->bytes = box->count * sizeof(float);
    c->st->len += p->bytes;
    return MT_OK;
}

static bool valid_extra_name(const char *n) {
    if (!n || !*n || strlen(n) > 200) return false;
    for (const char *c = n; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '-' || *c == '.'))
            return false;
    return true;
}

mt_status mt_ckpt_check_extras(const mt_checkpoint_extra *ex, int n) {
    if (n < 0 || (n > 0 && !ex))
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: %d extras given without an array", n);
    for (int i = 0; i < n; i++) {
        if (!valid_extra_name(ex[i].name))
            return mt_error(MT_ERR_INVALID_ARG, "checkpoint: extra %d's name '%s' must be 1-200 "
                            "letters, digits, '_', '-' or '.'", i, ex[i].name ? ex[i].name : "");
        if (ex[i].bytes > 0 && !ex[i].data)
            return mt_error(MT_ERR_INVALID_ARG, "checkpoint: extra '%s' has %zu bytes and no "
                            "data", ex[i].name, ex[i].bytes);
        for (int j = 0; j < i; j++)
            if (strcmp(ex[i].name, ex[j].name) == 0)
                return mt_error(MT_ERR_INVALID_ARG, "checkpoint: extra '%s' is given twice",
                                ex[i].name);
    }
    return MT_OK;
}

/* The device-to-host copies: every box of this rank's shards that it writes, in the order the
 * pieces were made, then the extras. Boxes that follow each other in the shard and in the
 * staging buffer (most of them: a parameter's boxes, and parameters one after the other) are
 * copied together, so that a GPU pays one copy per run rather than per box. */
typedef struct copy_ctx {
    mt_ckpt_stage *st;
    const mt_ckpt_plan *plan;
    size_t unit;
    mt_ckpt_kind kind;
    uint64_t at; /* next staging offset */
    const char *run_src; /* the run not yet copied: run_bytes from run_src to staging + run_at */
    uint64_t run_at, run_bytes;
    bool run_host; /* the run is in the host tier (an offloaded unit): never joined to another */
} copy_ctx;

static mt_status flush_run(copy_ctx *c) {
    if (c->run_bytes == 0) return MT_OK;
    char *dst = (char *)c->st->buf + c->run_at;
    mt_status st = MT_OK;
    /* The CPU device's shards are host memory: copied with streaming stores, since nothing here
     * reads the staging buffer soon, whereas glibc's memmove streams only above a threshold
     * from the cache size that a unit's run stays under (docs/benchmarks.md: the stall went
     * from about 1.05 to 0.80 of a plain copy of the same bytes). */
    if (mt_device_get_kind(c->plan->dev) == MT_DEVICE_CPU || c->run_host)
        mt_copy_stream(dst, c->run_src, c->run_bytes);
    else
        st = mt_device_copy(c->plan->dev, dst, c->run_src, c->run_bytes, MT_COPY_DEVICE_TO_HOST,
                            NULL);
    c->run_bytes = 0;
    return st;
}

static mt_status copy_box(const mt_ckpt_box *whole, void *arg) {
    copy_ctx *c = arg;
    const mt_ckpt_unit *cu = &c->plan->units[c->unit];
    size_t param;
    mt_ckpt_box clipped, *box = &clipped;
    if (!written_box(c->plan, c->unit, whole, box, &param)) return MT_OK;
    size_t bytes = box->count * sizeof(float);
    const char *src = (const char *)(cu->buf[c->kind] + (box->flat - cu->lo));
    if (c->run_bytes && src == c->run_src + c->run_bytes && c->at == c->run_at + c->run_bytes &&
        c->run_host == cu->host) {
        c->run_bytes += bytes;
    } else {
        MT_TRY(flush_run(c));
        c->run_src = src;
        c->run_host = cu->host;
        c->run_at = c->at;
        c->run_bytes = bytes;
    }
    c->at += bytes;
    return MT_OK;
}

static mt_status plan_pieces(mt_ckpt_stage *st, const mt_ckpt_plan *plan, int rank,
                              const mt_checkpoint_extra *extras, int n_extras) {
    int kinds = plan->has_optimizer ? MT_CKPT_KINDS : 1;
    for (size_t u = 0; u < plan->n_units; u++)
        for (int k = 0; k < kinds; k++) {
            box_ctx c = {st, plan, u, (mt_ckpt_kind)k};
            const mt_ckpt_unit *cu = &plan->units[u];
            MT_TRY(mt_ckpt_boxes(cu->layouts, cu->count, cu->lo, cu->hi, on_box, &c));
        }
    for (int i = 0; i < n_extras; i++) {
        const mt_checkpoint_extra *e = &extras[i];
        if (!e->per_rank && rank != 0) continue;
        mt_ckpt_piece *p;
        MT_TRY(add_piece(st, &p));
        p->name = strdup(e->name);
        if (!p->name) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
        p->is_extra = true;
        p->per_rank = e->per_rank;
        p->bytes = e->bytes;
        st->len += e->bytes;
    }
    return MT_OK;
}

mt_status mt_ckpt_stage_fill(mt_ckpt_stage *st, const mt_ckpt_plan *plan, int rank,
                             const mt_checkpoint_extra *extras, int n_extras) {
    mt_ckpt_stage_clear(st);
    st->dev = plan->dev;
    MT_TRY(plan_pieces(st, plan, rank, extras, n_extras));
    if (st->len > st->cap || !st->buf) {
        mt_staging_free(st->dev, st->buf);
        st->buf = NULL;
        st->cap = 0;
        MT_TRY(mt_staging_alloc(st->dev, st->len, &st->buf));
        st->cap = st->len;
    }
    int kinds = plan->has_optimizer ? MT_CKPT_KINDS : 1;
    copy_ctx cc = {st, plan, 0, MT_CKPT_MODEL, 0, NULL, 0, 0, false};
    for (size_t u = 0; u < plan->n_units; u++)
        for (int k = 0; k < kinds; k++) {
            cc.unit = u;
            cc.kind = (mt_ckpt_kind)k;
            const mt_ckpt_unit *cu = &plan->units[u];
            MT_TRY(mt_ckpt_boxes(cu->layouts, cu->count, cu->lo, cu->hi, copy_box, &cc));
        }
    MT_TRY(flush_run(&cc));
    for (int i = 0; i < n_extras; i++) {
        const mt_checkpoint_extra *e = &extras[i];
        if (!e->per_rank && rank != 0) continue;
        if (e->bytes) memcpy((char *)st->buf + cc.at, e->data, e->bytes);
        cc.at += e->bytes;
    }
    if (cc.at != st->len)
        return mt_error(MT_ERR_INTERNAL, "checkpoint: staged %" PRIu64 " bytes, planned %zu",
                        cc.at, st->len);
    return MT_OK;
}

void mt_ckpt_stage_clear(mt_ckpt_stage *st) {
    for (size_t i = 0; i < st->n_pieces; i++) free(st->pieces[i].name);
    st->n_pieces = 0;
    st->len = 0;
}

void mt_ckpt_stage_free(mt_ckpt_stage *st) {
    mt_ckpt_stage_clear(st);
    free(st->pieces);
    mt_staging_free(st->dev, st->buf);
    memset(st, 0, sizeof *st);
}
