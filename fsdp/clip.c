/* Gradient clipping by global norm over every FSDP shard of a root (include/meshtrain/fsdp.h).
 *
 * Each element of the model must be counted exactly once: a rank sums the squares of its shard's
 * real elements; the shard group's ranks hold disjoint pieces (sum over it); tp ranks hold
 * disjoint slices of Shard parameters but identical copies of Replicate ones, which only tp rank
 * 0 counts (sum over tp). HSDP replicas hold identical gradients after their all-reduce, so the
 * replicate group is not summed over. */
#include "core/error.h"
#include "fsdp/fsdp_shards.h"

#include <meshtrain/comm.h>
#include <meshtrain/fsdp.h>

#include <math.h>
#include <stdlib.h>

static double local_sum_of_squares(const mt_fsdp_shard_view *views, size_t n, int tp_rank) {
    double sum = 0.0;
    for (size_t u = 0; u < n; u++) {
        const mt_fsdp_shard_view *view = &views[u];
        for (size_t r = 0; r < view->n_ranges; r++) {
            const mt_fsdp_range *range = &view->ranges[r];
            if (range->tp_replicated && tp_rank > 0) continue;
            for (size_t i = range->begin; i < range->end && i < view->n; i++) {
                double g = view->grad[i];
                sum += g * g;
            }
        }
    }
    return sum;
}

static mt_status sum_over(mt_group *group, float *value) {
    if (!group || mt_group_size(group) < 2) return MT_OK;
    mt_status st = mt_all_reduce(group, value, value, 1, MT_F32, MT_REDUCE_SUM, NULL);
    if (st != MT_OK)
        return mt_error_wrap(st, "clip_grad_norm: all-reduce of the squared norm over group '%s'",
                             mt_group_name(group));
    return MT_OK;
}

mt_status mt_clip_grad_norm(mt_module *root, float max_norm, float *norm) {
    if (!root) return mt_error(MT_ERR_INVALID_ARG, "clip_grad_norm: root is NULL");
    mt_group *shard = NULL, *replicate = NULL, *tp = NULL;
    int tp_rank = 0;
    mt_status st = mt_fsdp_groups(root, &shard, &replicate, &tp, &tp_rank);
    if (st != MT_OK)
        return mt_error_wrap(st, "clip_grad_norm: module '%s' is not an FSDP root",
                             mt_module_name(root));
    mt_fsdp_shard_view *views = NULL;
    size_t n = 0;
    MT_TRY(mt_fsdp_collect_shards(root, &views, &n));

    /* Every rank takes part in the reductions, whatever its own shard holds. */
    float sq = (float)local_sum_of_squares(views, n, tp_rank);
    st = sum_over(shard, &sq);
    if (st == MT_OK) st = sum_over(tp, &sq);
    if (st != MT_OK) {
        free(views);
        return st;
    }
    float total = sqrtf(sq);
    if (norm) *norm = total;

    /* A NaN or infinite norm gives no finite factor: leave the gradients for the caller to see. */
    double coef = (double)max_norm / ((double)total + 1e-6);
    if (max_norm > 0.0f && isfinite(total) && coef < 1.0) {
        float c = (float)coef;
        for (size_t u = 0; u < n; u++) {
            float *g = views[u].grad;
            for (size_t i = 0; i < views[u].n; i++) g[i] *= c;
        }
    }
    free(views);
    return MT_OK;
}
