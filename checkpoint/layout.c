/* Flat ranges to global boxes (checkpoint/layout.h). */
#include "checkpoint/layout.h"

#include "core/error.h"

mt_status mt_ckpt_local_shape(const mt_ckpt_param_layout *p, int64_t *local) {
    if (p->ndim < 0 || p->ndim > MT_PARAM_MAX_DIMS)
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint layout: %d dimensions", p->ndim);
    for (int d = 0; d < p->ndim; d++) {
        local[d] = p->global_shape[d];
        if (d != p->tp_dim) continue;
        if (p->tp_size < 1 || p->tp_rank < 0 || p->tp_rank >= p->tp_size ||
            p->global_shape[d] % p->tp_size != 0)
            return mt_error(MT_ERR_INVALID_ARG, "checkpoint layout: dimension %d of size %lld "
                            "cannot be split over tp rank %d of %d", d,
                            (long long)p->global_shape[d], p->tp_rank, p->tp_size);
        local[d] = p->global_shape[d] / p->tp_size;
    }
    return MT_OK;
}

size_t mt_ckpt_local_numel(const mt_ckpt_param_layout *p) {
    int64_t local[MT_PARAM_MAX_DIMS];
    if (mt_ckpt_local_shape(p, local) != MT_OK) return 0;
    size_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= (size_t)local[d];
    return n;
}

/* The boxes of [a, b), element indices of one tp-local tensor of shape local (row-major). At a,
 * the box is as large as alignment allows: a whole block of the outermost dimension j whose
 * block size (suffix[j], the elements below it) divides a and fits in what is left, then as many
 * such blocks along dimension j - 1 as the range and that dimension's remaining length allow. */
static mt_status walk_param(const mt_ckpt_param_layout *p, size_t index, const int64_t *local,
                            size_t a, size_t b, mt_ckpt_box_fn fn, void *arg) {
    int nd = p->ndim;
    size_t suffix[MT_PARAM_MAX_DIMS + 1];
    suffix[nd] = 1;
    for (int d = nd - 1; d >= 0; d--) suffix[d] = suffix[d + 1] * (size_t)local[d];
    while (a < b) {
        int j = 0;
        while (j < nd && (a % suffix[j] != 0 || suffix[j] > b - a)) j++;
        mt_ckpt_box box = {.param = index, .ndim = nd, .flat = p->offset + a};
        size_t rest = a, count;
        for (int d = 0; d < nd; d++) {
            int64_t idx = (int64_t)(rest / suffix[d + 1]);
            rest %= suffix[d + 1];
            box.offset[d] = idx;
            box.extent[d] = d < j - 1 ? 1 : d == j - 1 ? 0 : local[d];
        }
        if (j == 0) {
            count = suffix[0]; /* the whole tensor (a scalar too: ndim 0) */
        } else {
            size_t fit = (b - a) / suffix[j], room = (size_t)(local[j - 1] - box.offset[j - 1]);
            size_t blocks = fit < room ? fit : room;
            box.extent[j - 1] = (int64_t)blocks;
            count = blocks * suffix[j];
        }
        box.count = count;
        /* tp-local to global: the rank's slab along the split dimension. */
        if (p->tp_dim >= 0 && p->tp_dim < nd)
            box.offset[p->tp_dim] += p->tp_rank * local[p->tp_dim];
        MT_TRY(fn(&box, arg));
        a += count;
    }
    return MT_OK;
}

mt_status mt_ckpt_boxes(const mt_ckpt_param_layout *params, size_t n, size_t lo, size_t hi,
                        mt_ckpt_box_fn fn, void *arg) {
    if (!fn || (n > 0 && !params) || lo > hi)
        return mt_error(MT_ERR_INVALID_ARG, "mt_ckpt_boxes: bad arguments");
    for (size_t i = 0; i < n; i++) {
        const mt_ckpt_param_layout *p = &params[i];
        int64_t local[MT_PARAM_MAX_DIMS];
        MT_TRY(mt_ckpt_local_shape(p, local));
        size_t numel = mt_ckpt_local_numel(p), start = p->offset, end = start + numel;
        size_t a = lo > start ? lo : start, b = hi < end ? hi : end;
        if (a < b) MT_TRY(walk_param(p, i, local, a - start, b - start, fn, arg));
    }
    return MT_OK;
}
