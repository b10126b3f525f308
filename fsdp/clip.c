/* Gradient clipping by global norm over every FSDP shard of a root (include/meshtrain/fsdp.h).
 *
 * Each element of the model must be counted exactly once: a rank sums the squares of its shard's
 * real elements; the shard group's ranks hold disjoint pieces (sum over it); tp ranks hold
 * disjoint slices of Shard parameters but identical copies of Replicate ones, which only tp rank
 * 0 counts (sum over tp). HSDP replicas hold identical gradients after their all-reduce, so the
 * replicate group is not summed over.
 *
 * The shards live in device memory: the squares are summed by mt_op_sum_squares into one double
 * on the device (queued, no wait per range), read back once, reduced across ranks as a host
 * scalar, and the gradients are scaled by mt_fsdp_scale_grads: in place by mt_op_scale, except
 * on the CPU device, where the factor waits for the optimizer's step to apply it as it reads the
 * gradients (fsdp/fsdp_shards.h), so that clipping costs no pass of its own over them. An
 * offloaded unit's gradient shard is in the host tier (view.host): the CPU kernels of those ops
 * run on it directly. A shard whose reduce-scatter took its sums of squares (view.grad_sq,
 * comm/coll_squares.h) is not read at all: its partial sums are added as mt_op_sum_squares would
 * add the same ones, so the norm has the same bits either way. */
#include "core/clock.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/sum_squares.h"
#include "core/env.h"
#include "core/error.h"
#include "fsdp/fsdp_internal.h"
#include "fsdp/fsdp_shards.h"

#include <meshtrain/comm.h>
#include <meshtrain/fsdp.h>
#include <meshtrain/log.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static bool g_fused = true;
static pthread_once_t g_fused_once = PTHREAD_ONCE_INIT;

static void fused_read(void) {
    long long on = 1;
    if (mt_env_int("MT_FSDP_FUSED_SQUARES", 0, 1, 1,
                   "1: reduce-scatters take the sums of squares of clipping", &on) != MT_OK)
        mt_log(MT_LOG_WARN, "%s; keeping them on", mt_last_error());
    g_fused = on != 0;
}

bool mt_fsdp_fused_squares(void) {
    pthread_once(&g_fused_once, fused_read);
    return g_fused;
}

/* Whether every element of the view is counted on this rank: then the whole shard [0, n) is
 * summed at once (its padding holds zeros, which add nothing), in the chunks the reduce-scatter's
 * sums of squares use; else range by range, leaving out what tp rank 0 counts. */
static bool counts_whole_shard(const mt_fsdp_shard_view *view, int tp_rank) {
    if (tp_rank == 0) return true;
    for (size_t r = 0; r < view->n_ranges; r++)
        if (view->ranges[r].tp_replicated) return false;
    return true;
}

/* This rank's sum of squares into *out (host memory). The accumulator is scratch of the step,
 * charged to activations and freed before returning. The ops add onto one running double in
 * view order; a shard counted whole is one op over all of it, in the chunks its reduce-scatter's
 * sums of squares have, so that those sums stand for it bit for bit. */
static mt_status local_sum_of_squares(mt_device *dev, const mt_fsdp_shard_view *views, size_t n,
                                      int tp_rank, double *out) {
    double *acc = NULL;
    mt_status st = mt_device_alloc(dev, sizeof *acc, MT_MEM_ACTIVATIONS, (void **)&acc);
    if (st != MT_OK)
        return mt_error_wrap(st, "clip_grad_norm: the accumulator of the squared norm");
    st = mt_device_memset(dev, acc, 0, sizeof *acc, NULL);
    /* One running sum in view order wherever the shards are: it moves to the host before a
     * host-tier view and back before a device view, so any mix of resident and offloaded units
     * adds in the same order (and gives the same bits) as all resident. */
    double host_sum = 0.0;
    bool on_host = false;
    for (size_t u = 0; u < n && st == MT_OK; u++) {
        const mt_fsdp_shard_view *view = &views[u];
        if (view->host != on_host) {
            st = view->host
                     ? mt_device_copy(dev, &host_sum, acc, sizeof host_sum, MT_COPY_DEVICE_TO_HOST,
                                      NULL)
                     : mt_device_copy(dev, acc, &host_sum, sizeof host_sum, MT_COPY_HOST_TO_DEVICE,
                                      NULL);
            on_host = view->host;
            if (st != MT_OK) break;
        }
        if (counts_whole_shard(view, tp_rank)) {
            if (view->grad_sq) {
                /* Only resident shards on the CPU device have them (fsdp_schedule.c): the
                 * running sum is in acc, which is host memory there. */
                *acc = mt_sum_squares_add_partials(*acc, view->grad_sq,
                                                   (view->n + MT_SQ_CHUNK - 1) / MT_SQ_CHUNK);
            } else if (view->n > 0) {
                st = view->host ? mt_cpu_op_sum_squares(view->grad, view->n, &host_sum)
                                : mt_op_sum_squares(dev, view->grad, view->n, acc);
            }
            if (st != MT_OK)
                mt_error_wrap(st, "clip_grad_norm: sum of squares of unit '%s'",
                              view->unit_name);
            continue;
        }
        for (size_t r = 0; r < view->n_ranges && st == MT_OK; r++) {
            const mt_fsdp_range *range = &view->ranges[r];
            if (range->tp_replicated) continue;
            size_t end = range->end < view->n ? range->end : view->n;
            if (range->begin >= end) continue;
            st = view->host
                     ? mt_cpu_op_sum_squares(view->grad + range->begin, end - range->begin,
                                             &host_sum)
                     : mt_op_sum_squares(dev, view->grad + range->begin, end - range->begin, acc);
            if (st != MT_OK)
                mt_error_wrap(st, "clip_grad_norm: sum of squares of unit '%s'",
                              view->unit_name);
        }
    }
    if (st == MT_OK && on_host) {
        *out = host_sum;
    } else if (st == MT_OK) {
        st = mt_device_copy(dev, out, acc, sizeof *out, MT_COPY_DEVICE_TO_HOST, NULL);
        if (st != MT_OK) mt_error_wrap(st, "clip_grad_norm: reading back the squared norm");
    }
    mt_device_free(dev, acc);
    return st;
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
    /* The overlapped optimizer step (mt_adamw_set_overlap) may already have used a unit's
     * gradient when its shard landed during the backward: scaling it now would change nothing
     * that step did. Every rank has the same setting, so every rank refuses alike. */
    if (max_norm > 0.0f && mt_fsdp_grad_landed_installed(root))
        return mt_error(MT_ERR_INVALID_ARG,
                        "clip_grad_norm(%g) on '%s': the overlapped optimizer step is on "
                        "(mt_adamw_set_overlap), which steps offloaded units during the backward, "
                        "before the global norm exists; turn the overlap off to clip, or pass "
                        "max_norm 0 to only compute the norm", (double)max_norm,
                        mt_module_name(root));
    mt_device *dev = mt_fsdp_device(root);
    mt_fsdp_shard_view *views = NULL;
    size_t n = 0;
    MT_TRY(mt_fsdp_collect_shards(root, &views, &n));

    /* Every rank takes part in the reductions, whatever its own shard holds. A rank whose local
     * sum failed still does, with a NaN, so that the others get a NaN norm (and leave their
     * gradients alone) instead of waiting for it until the timeout; it returns its own error. */
    double local = 0.0;
    char saved[1024];
    mt_status local_st = local_sum_of_squares(dev, views, n, tp_rank, &local);
    if (local_st != MT_OK) snprintf(saved, sizeof saved, "%s", mt_last_error());
    float sq = local_st == MT_OK ? (float)local : NAN;
    double t0 = mt_clock_now_s();
    st = sum_over(shard, &sq);
    if (st == MT_OK) st = sum_over(tp, &sq);
    /* Blocked on the other ranks: communication the step exposes, as the units' waits are. */
    mt_fsdp_unit *ru = mt_fsdp_unit_of(root);
    if (ru) ru->debug.wait_s += mt_clock_now_s() - t0;
    if (local_st != MT_OK || st != MT_OK) {
        free(views);
        return local_st != MT_OK ? mt_error_restore(local_st, saved) : st;
    }
    float total = sqrtf(sq);
    if (norm) *norm = total;

    /* A NaN or infinite norm gives no finite factor: leave the gradients for the caller to see. */
    double coef = (double)max_norm / ((double)total + 1e-6);
    free(views);
    if (max_norm > 0.0f && isfinite(total) && coef < 1.0) st = mt_fsdp_scale_grads(root,
                                                                                   (float)coef);
    return st;
}
