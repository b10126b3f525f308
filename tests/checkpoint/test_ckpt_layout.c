/* Flat FSDP shards to global boxes (checkpoint/layout.c), as a property over random layouts:
 * parameters of 0 to 4 dimensions, replicated or split over tp 1, 2 or 4 along any dimension,
 * flat buffers padded to 1 to 8 shards. Every element of every flat buffer is tagged with its
 * parameter and global linear index; for every shard of every tp rank the boxes must name
 * exactly those elements, in flat order, each box contiguous; and over all shards and tp ranks
 * every global element of a split parameter is covered once, of a replicated one tp times. */
#include "check.h"
#include "checkpoint/layout.h"
#include "numeric.h"

#include <stdlib.h>
#include <string.h>

#define MAXP 4

typedef struct walk {
    const uint64_t *flat; /* the tagged flat buffer of one tp rank */
    const mt_ckpt_param_layout *params;
    int64_t *cover[MAXP];
    size_t next_flat; /* where the next box must start (elements skipped: padding or a gap) */
    size_t lo, hi, seen;
    int boxes_in_param[MAXP];
    bool order_ok, values_ok;
} walk;

static uint64_t tag(size_t param, size_t global_index) {
    return ((uint64_t)param << 40) | (uint64_t)global_index;
}

static size_t global_index(const mt_ckpt_param_layout *p, const int64_t *coord) {
    size_t g = 0;
    for (int d = 0; d < p->ndim; d++) g = g * (size_t)p->global_shape[d] + (size_t)coord[d];
    return g;
}

static mt_status on_box(const mt_ckpt_box *b, void *arg) {
    walk *w = arg;
    const mt_ckpt_param_layout *p = &w->params[b->param];
    size_t count = 1;
    for (int d = 0; d < b->ndim; d++) count *= (size_t)b->extent[d];
    if (count != b->count || b->count == 0 || b->flat < w->next_flat || b->flat < w->lo ||
        b->flat + b->count > w->hi)
        w->order_ok = false;
    w->next_flat = b->flat + b->count;
    w->seen += b->count;
    w->boxes_in_param[b->param]++;
    /* Row-major over the box: the flat elements must be these global elements. */
    int64_t coord[MT_PARAM_MAX_DIMS], step[MT_PARAM_MAX_DIMS] = {0};
    for (size_t e = 0; e < b->count; e++) {
        for (int d = 0; d < b->ndim; d++) coord[d] = b->offset[d] + step[d];
        size_t g = global_index(p, coord);
        if (w->flat[b->flat + e] != tag(b->param, g)) w->values_ok = false;
        w->cover[b->param][g]++;
        for (int d = b->ndim - 1; d >= 0; d--) {
            if (++step[d] < b->extent[d]) break;
            step[d] = 0;
        }
    }
    return MT_OK;
}

/* A random layout: n parameters, their tp split, their offsets (packed, as FSDP does). */
static size_t random_layout(uint64_t *rng, int tp, mt_ckpt_param_layout *params, size_t n) {
    size_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        mt_ckpt_param_layout *p = &params[i];
        memset(p, 0, sizeof *p);
        p->ndim = (int)(test_rand_unit(rng) * 5); /* 0..4 */
        p->tp_size = tp;
        p->tp_dim = p->ndim > 0 && test_rand_unit(rng) < 0.7 ? (int)(test_rand_unit(rng) * p->ndim)
                                                             : -1;
        for (int d = 0; d < p->ndim; d++) {
            p->global_shape[d] = 1 + (int64_t)(test_rand_unit(rng) * 5);
            if (d == p->tp_dim) p->global_shape[d] *= tp;
        }
        p->offset = offset;
        offset += mt_ckpt_local_numel(p); /* tp_rank does not change the size */
    }
    return offset;
}

static size_t global_numel(const mt_ckpt_param_layout *p) {
    size_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= (size_t)p->global_shape[d];
    return n;
}

/* The tp-local tensor of tp rank r, tagged, at its offset in flat. */
static void fill_local(const mt_ckpt_param_layout *p, size_t index, uint64_t *flat) {
    int64_t local[MT_PARAM_MAX_DIMS], coord[MT_PARAM_MAX_DIMS];
    CHECK_OK(mt_ckpt_local_shape(p, local));
    size_t n = mt_ckpt_local_numel(p);
    for (size_t e = 0; e < n; e++) {
        size_t rest = e;
        for (int d = p->ndim - 1; d >= 0; d--) {
            coord[d] = (int64_t)(rest % (size_t)local[d]);
            rest /= (size_t)local[d];
        }
        if (p->tp_dim >= 0) coord[p->tp_dim] += p->tp_rank * local[p->tp_dim];
        flat[p->offset + e] = tag(index, global_index(p, coord));
    }
}

static void one_case(uint64_t *rng, int *cases) {
    static const int tps[3] = {1, 2, 4};
    int tp = tps[(int)(test_rand_unit(rng) * 3)];
    int world = 1 + (int)(test_rand_unit(rng) * 8);
    size_t n = 1 + (size_t)(test_rand_unit(rng) * MAXP);
    mt_ckpt_param_layout params[MAXP];
    size_t total = random_layout(rng, tp, params, n);
    size_t shard = (total + (size_t)world - 1) / (size_t)world, padded = shard * (size_t)world;
    int64_t *cover[MAXP] = {0};
    for (size_t i = 0; i < n; i++) cover[i] = calloc(global_numel(&params[i]), sizeof(int64_t));
    uint64_t *flat = calloc(padded ? padded : 1, sizeof *flat);
    for (int t = 0; t < tp; t++) {
        for (size_t i = 0; i < n; i++) {
            params[i].tp_rank = t;
            fill_local(&params[i], i, flat);
        }
        for (size_t k = total; k < padded; k++) flat[k] = UINT64_MAX; /* padding: never named */
        for (int r = 0; r < world; r++) {
            walk w = {.flat = flat, .params = params, .lo = r * shard, .hi = (r + 1) * shard,
                      .next_flat = r * shard, .order_ok = true, .values_ok = true};
            memcpy(w.cover, cover, sizeof cover);
            CHECK_OK(mt_ckpt_boxes(params, n, w.lo, w.hi, on_box, &w));
            size_t expect = w.hi < total ? shard : w.lo < total ? total - w.lo : 0;
            CHECK_MSG(w.order_ok && w.values_ok && w.seen == expect,
                      "tp %d/%d shard %d/%d: order %d values %d, %zu elements, expected %zu", t,
                      tp, r, world, w.order_ok, w.values_ok, w.seen, expect);
            for (size_t i = 0; i < n; i++)
                CHECK_MSG(w.boxes_in_param[i] <= 2 * params[i].ndim + 1,
                          "%d boxes for a %d-d parameter", w.boxes_in_param[i], params[i].ndim);
        }
    }
    for (size_t i = 0; i < n; i++) {
        int64_t want = params[i].tp_dim >= 0 ? 1 : tp;
        size_t bad = 0;
        for (size_t g = 0; g < global_numel(&params[i]); g++) bad += cover[i][g] != want;
        CHECK_MSG(bad == 0, "parameter %zu (%d-d, tp_dim %d, tp %d): %zu elements not covered "
                  "%lld time(s)", i, params[i].ndim, params[i].tp_dim, tp, bad, (long long)want);
        free(cover[i]);
    }
    free(flat);
    ++*cases;
}

static mt_status count_box(const mt_ckpt_box *b, void *arg) {
    (void)b;
    ++*(int *)arg;
    return MT_OK;
}

int main(void) {
    uint64_t rng = 12345;
    int cases = 0;
    for (int i = 0; i < 2000; i++) one_case(&rng, &cases);

    /* A known case: a 4 x 6 matrix split on dimension 1 over tp 2 (local 4 x 3), tp rank 1,
     * local elements [4, 11): the end of row 1, row 2, the start of row 3. */
    mt_ckpt_param_layout m = {.ndim = 2, .global_shape = {4, 6}, .tp_dim = 1, .tp_size = 2,
                              .tp_rank = 1};
    int nboxes = 0;
    CHECK_OK(mt_ckpt_boxes(&m, 1, 4, 11, count_box, &nboxes));
    CHECK(nboxes == 3);
    nboxes = 0;
    CHECK_OK(mt_ckpt_boxes(&m, 1, 0, 12, count_box, &nboxes));
    CHECK(nboxes == 1); /* the whole tp-local slab is one box */

    m.global_shape[1] = 5; /* 5 columns cannot be split over 2 tp ranks */
    CHECK(mt_ckpt_boxes(&m, 1, 0, 1, count_box, &nboxes) == MT_ERR_INVALID_ARG);
    CHECK(mt_ckpt_boxes(&m, 1, 2, 1, count_box, &nboxes) == MT_ERR_INVALID_ARG);
    CHECK_MSG(cases == 2000, "%d random layouts checked", cases);
    return check_report("test_ckpt_layout");
}
