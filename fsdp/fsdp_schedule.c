/* The FSDP schedule: what happens before and after a unit's forward and backward.
 *
 * The outermost unit (the root) delimits a pass: its pre-hook starts it, its post-hook ends it.
 * On the first forward (backward) pass the units are recorded in the order their hooks run; from
 * then on a unit's pre-hook issues the all-gather of the unit after it in that order (unless an
 * explicit prefetch list was set, or prefetch is off) before waiting for its own, so that the
 * next unit's gather overlaps this unit's compute. In backward a unit's reduce-scatter is issued
 * by its post-hook after finishing the previous one (at most one in flight), and the outermost
 * post-hook finishes the last one and reshards everything, so gradients are complete and memory
 * is back to the shards when mt_module_backward returns.
 *
 * A forward that activation recompute re-runs inside a backward (mt_module_recomputing) is no
 * pass: the unit is gathered only if it was resharded, and kept for the backward (pre_recompute).
 */
#include "fsdp/fsdp_internal.h"
#include "fsdp/fsdp_offload.h"

#include "comm/coll_squares.h"
#include "core/clock.h"
#include "core/cpu/sum_squares.h"
#include "core/debug_poison.h"
#include "core/error.h"

#include <meshtrain/log.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reshards_after_forward(const mt_fsdp_unit *u) {
    if (u->reshard_after_forward >= 0) return u->reshard_after_forward != 0;
    return !mt_fsdp_is_outermost(u);
}

/* After a collective failed the ranks no longer agree on what comes next: every later pass on
 * the model fails with the first message instead of issuing mismatched collectives. */
static mt_status mark_broken(mt_fsdp_root *r, mt_status st) {
    if (!r->broken) {
        const char *msg = mt_last_error();
        size_t n = strlen(msg) + 1;
        r->broken = malloc(n);
        if (r->broken) memcpy(r->broken, msg, n);
    }
    return st;
}

static mt_status check_broken(const mt_fsdp_root *r, const mt_fsdp_unit *u) {
    if (!r->broken) return MT_OK;
    return mt_error(MT_ERR_COMM, "unit '%s': an earlier collective of this model failed, so its "
                    "ranks are out of step (first failure: %s)", u->module->name, r->broken);
}

static mt_status record(mt_fsdp_order *order, mt_fsdp_unit *u) {
    for (size_t i = 0; i < order->n; i++)
        if (order->units[i] == u) return MT_OK; /* a unit run twice keeps its first place */
    if (order->n == order->cap) {
        size_t c = order->cap ? order->cap * 2 : 8;
        mt_fsdp_unit **l = realloc(order->units, c * sizeof *l);
        if (!l) return mt_error(MT_ERR_OUT_OF_MEMORY, "recording the FSDP order: out of host "
                                "memory");
        order->units = l;
        order->cap = c;
    }
    order->units[order->n++] = u;
    return MT_OK;
}

static void finish_recording(mt_fsdp_root *r, bool backward) {
    mt_fsdp_order *order = &r->order[backward];
    for (size_t i = 0; i < order->n; i++) {
        mt_fsdp_unit *u = order->units[i];
        mt_fsdp_unit *next = i + 1 < order->n ? order->units[i + 1] : NULL;
        if (backward) u->bwd_next = next;
        else u->fwd_next = next;
        if (mt_log_enabled(MT_LOG_DEBUG))
            mt_log(MT_LOG_DEBUG, "fsdp: recorded %s order %zu: unit '%s' prefetches '%s'",
                   backward ? "backward" : "forward", i, u->module->name,
                   next ? next->module->name : "(none)");
    }
    order->recorded = true;
}

static mt_status prefetch(mt_fsdp_unit *u, bool backward) {
    if (!u->prefetch_enabled) return MT_OK;
    bool expl = backward ? u->bwd_explicit : u->fwd_explicit;
    mt_fsdp_unit *const *list = backward ? u->bwd_prefetch : u->fwd_prefetch;
    int n = backward ? u->n_bwd_prefetch : u->n_fwd_prefetch;
    mt_fsdp_unit *next = backward ? u->bwd_next : u->fwd_next;
    if (!expl) {
        list = &next;
        n = next ? 1 : 0;
    }
    for (int i = 0; i < n; i++) {
        mt_fsdp_unit *t = list[i];
        if (!t || t->state != MT_UNIT_SHARDED || !t->prefetch_enabled) continue;
        MT_TRY(mt_fsdp_unshard_issue(t));
        t->debug.prefetches++;
        /* Full offload: the shard of the unit after t is staged to the device now, so that its
         * gather (issued when t starts) finds it there. */
        mt_fsdp_unit *after = backward ? t->bwd_next : t->fwd_next;
        if (after) MT_TRY(mt_fsdp_offload_stage_start(after));
    }
    return MT_OK;
}

/* Issues u's all-gather unless a prefetch did, prefetches the next unit(s), waits for u's. */
static mt_status unshard_for(mt_fsdp_unit *u, bool backward) {
    MT_TRY(mt_fsdp_unshard_issue(u));
    MT_TRY(prefetch(u, backward));
    return mt_fsdp_unshard_wait(u);
}

/* Ends a pass of root r: reshards every unit still holding full parameters (a prefetched unit
 * that did not run, or, after backward, those kept from forward). */
/* After a pass's backward: a unit whose forward ran in it but whose backward did not gets no
 * gradient, silently (a backward that forgets to call mt_module_backward on a child gives a
 * gradient norm of zero for it). Said once per unit. */
static void warn_if_no_backward(const mt_fsdp_root *r, mt_fsdp_unit *u) {
    if (u->forward_pass != r->pass || u->backward_pass == r->pass || u->warned_no_backward)
        return;
    u->warned_no_backward = true;
    mt_log(MT_LOG_WARN, "fsdp: module '%s' ran its forward but not its backward in this step, so "
           "its parameters got no gradient: does the backward of its parent call "
           "mt_module_backward on it?", u->module->name);
}

/* The end of a pass at the outermost unit: every unit's full parameters go (those that keep
 * them after forward stay when keep_non_resharding); after a complete backward
 * (check_backward) the units it skipped are reported, in the same walk. */
static mt_status reshard_all(mt_fsdp_root *r, bool keep_non_resharding, bool check_backward) {
    mt_fsdp_unit **units;
    size_t n;
    MT_TRY(mt_fsdp_units_below(r->unit->module, &units, &n));
    mt_status st = MT_OK;
    for (size_t i = 0; i < n; i++) {
        mt_fsdp_unit *u = units[i];
        if (check_backward) warn_if_no_backward(r, u);
        if (u->state == MT_UNIT_SHARDED) { /* a shard staged ahead for a gather that never came */
            st = st == MT_OK ? mt_fsdp_offload_gathered(u) : mt_fsdp_offload_gathered_after(u, st);
            continue;
        }
        if (keep_non_resharding && !reshards_after_forward(u)) continue;
        mt_status s = mt_fsdp_reshard(u);
        if (st == MT_OK) st = s;
    }
    free(units);
    return st;
}

/* What both pre-hooks do: refuse after a failed collective, record the order while the first
 * pass runs (a pass that failed before completing is recorded again from its start), unshard. */
static mt_status pre_hook(mt_fsdp_unit *u, bool backward) {
    mt_fsdp_root *r = u->root;
    MT_TRY(check_broken(r, u));
    mt_fsdp_order *order = &r->order[backward];
    if (!order->recorded) {
        if (u == r->unit) order->n = 0;
        MT_TRY(record(order, u));
    }
    mt_status st = unshard_for(u, backward);
    return st == MT_OK ? MT_OK : mark_broken(r, st);
}

/* A recompute forward (activation recompute re-running a module for its backward, with this
 * unit's hooks inside its registration): part of the backward, not a forward pass. The unit is
 * gathered only when it was resharded (no second gather of parameters kept since the forward),
 * and nothing is prefetched in forward order (those units ran their backward already) or
 * recorded. */
static mt_status pre_recompute(mt_fsdp_unit *u) {
    MT_TRY(check_broken(u->root, u));
    mt_status st = mt_fsdp_unshard_wait(u);
    return st == MT_OK ? MT_OK : mark_broken(u->root, st);
}

static mt_status pre_forward(mt_module *module, void *unit) {
    mt_fsdp_unit *u = unit;
    if (mt_module_recomputing(module)) return pre_recompute(u);
    if (u == u->root->unit) {
        mt_fsdp_root *r = u->root;
        /* An overlapped optimizer step still running writes masters this pass stages. */
        if (r->pass_begin) MT_TRY(r->pass_begin(r->grad_landed_arg));
        r->pass++;
    }
    u->forward_pass = u->root->pass;
    return pre_hook(u, false);
}

static mt_status post_forward(mt_module *module, void *unit, mt_status user_status) {
    mt_fsdp_unit *u = unit;
    /* After a recompute forward the backward follows at once: the parameters stay. A failed
     * recompute forward fails the module's backward before it starts, so this unit's
     * post-backward (which would reshard it) never runs: reshard here, or it stays gathered. */
    if (mt_module_recomputing(module)) {
        if (user_status == MT_OK) return MT_OK;
        char failed[1024];
        snprintf(failed, sizeof failed, "%s", mt_last_error());
        mt_status st = mt_fsdp_reshard(u);
        if (st != MT_OK) mark_broken(u->root, st);
        return mt_error_restore(user_status, failed);
    }
    mt_fsdp_root *r = u->root;
    char saved[1024];
    if (user_status != MT_OK) snprintf(saved, sizeof saved, "%s", mt_last_error());
    mt_status st = MT_OK;
    if (reshards_after_forward(u)) st = mt_fsdp_reshard(u);
    if (u == r->unit) {
        mt_status s = reshard_all(r, true, false);
        if (st == MT_OK) st = s;
        if (!r->order[0].recorded && user_status == MT_OK) finish_recording(r, false);
    }
    if (st != MT_OK) mark_broken(r, st);
    if (user_status != MT_OK) return mt_error_restore(user_status, saved);
    return st;
}

bool mt_fsdp_rs_into_shard(const mt_fsdp_unit *u) {
    return u->nranks > 1 && (!u->replicate || mt_group_size(u->replicate) == 1) &&
           u->reduce_dtype == MT_F32 && u->offload == MT_OFFLOAD_NONE && u->grad_shard_zero;
}

/* After a reduce-scatter into the shard failed: what it wrote goes, the shard was all zeros. */
static void rs_in_shard_undo(mt_fsdp_unit *u) {
    u->grad_sq_valid = false;
    if (mt_device_memset(u->dev, u->grad_shard, 0, u->S * sizeof(float), NULL) == MT_OK) {
        u->grad_shard_zero = true;
        u->grad_shard_lazy = false;
    }
}

/* Adds the reduced shard of unit p into its sharded gradient and frees the staging buffers.
 * HSDP: the shard is first averaged over the replicate dimension. */
static mt_status finish_rs(mt_fsdp_unit *p) {
    char desc[256];
    mt_status st = MT_OK;
    double t0 = mt_clock_now_s();
    if (p->rs_work) {
        st = mt_work_wait(p->rs_work, -1);
        mt_work_free(p->rs_work);
        p->rs_work = NULL;
        if (st != MT_OK)
            mt_error_wrap(st, "reduce-scatter of the gradients of %s over '%s'",
                          mt_fsdp_unit_desc(p, desc, sizeof desc), p->shard_dim);
    }
    if (st == MT_OK && p->replicate && p->S > 0) {
        st = mt_all_reduce(p->replicate, p->rs_recv, p->rs_recv, p->S, p->reduce_dtype,
                           MT_REDUCE_AVG, NULL);
        if (st != MT_OK)
            mt_error_wrap(st, "all-reduce of the gradients of %s over '%s'",
                          mt_fsdp_unit_desc(p, desc, sizeof desc), p->replicate_dim);
    }
    p->debug.wait_s += mt_clock_now_s() - t0;
    if (st == MT_OK && p->S > 0) {
        /* Offloaded: the gradient shard is in the host tier; the reduced shard follows it. */
        if (p->offload) {
            st = mt_fsdp_offload_grad_in(p, p->rs_recv); /* takes rs_recv over */
            p->rs_recv = NULL;
        } else if (!p->rs_in_shard) { /* else it landed in the shard */
            st = mt_fsdp_grad_shard_ready(p);
            if (st == MT_OK)
                st = mt_op_accumulate(p->dev, p->grad_shard, p->rs_recv, p->reduce_dtype, p->S);
            p->grad_shard_zero = false;
        }
        if (st != MT_OK)
            mt_error_wrap(st, "adding the reduced gradient shard of %s",
                          mt_fsdp_unit_desc(p, desc, sizeof desc));
    }
    if (st == MT_OK && p->rs_in_shard && p->grad_sq_asked) {
        p->grad_sq_valid = true;
        p->debug.fused_squares++;
    }
    mt_device_free(p->dev, p->rs_send);
    if (!p->rs_in_shard) mt_device_free(p->dev, p->rs_recv);
    else if (st != MT_OK) rs_in_shard_undo(p);
    mt_device_free(p->dev, p->full_grad);
    p->rs_send = p->rs_recv = NULL;
    p->rs_in_shard = false;
    p->full_grad = NULL;
    return st;
}

/* Finishes the outstanding reduce-scatter of root r, if any. */
static mt_status finish_pending_rs(mt_fsdp_root *r) {
    mt_fsdp_unit *p = r->rs_pending;
    if (!p) return MT_OK;
    r->rs_pending = NULL;
    r->rs_outstanding--;
    return finish_rs(p);
}

/* Whether u's reduce-scatter should take the sums of squares of the shard it writes, for
 * gradient clipping (grad_sq): into the zeroed shard of CPU memory (the host backend's kernels
 * read and write it), unless MT_FSDP_FUSED_SQUARES=0. Without room for them (a few hundred
 * bytes) clipping reads the shard as before. */
static bool wants_squares(mt_fsdp_unit *u) {
    if (!u->rs_in_shard || mt_device_get_kind(u->dev) != MT_DEVICE_CPU ||
        !mt_fsdp_fused_squares())
        return false;
    size_t chunks = (u->S + MT_SQ_CHUNK - 1) / MT_SQ_CHUNK;
    if (!u->grad_sq) u->grad_sq = malloc(chunks * sizeof *u->grad_sq);
    return u->grad_sq != NULL;
}

static mt_status issue_rs(mt_fsdp_root *r, mt_fsdp_unit *u) {
    char desc[256];
    size_t es = mt_dtype_size(u->reduce_dtype);
    /* Into a shard of zeros the reduced gradient lands where it is added: 0 + g is g, without a
     * staging buffer and a pass to add it. */
    u->rs_in_shard = mt_fsdp_rs_into_shard(u);
    u->grad_sq_valid = u->grad_sq_asked = false;
    mt_status st = MT_OK;
    if (u->rs_in_shard) {
        /* The reduce-scatter writes all S elements: a lazily zeroed shard needs no zeros. */
        u->rs_recv = u->grad_shard;
        u->grad_shard_zero = false;
        u->grad_shard_lazy = false;
    } else {
        st = mt_device_alloc(u->dev, u->S * es, MT_MEM_COMM, &u->rs_recv);
    }
    const void *send = u->full_grad;
    if (st == MT_OK && u->reduce_dtype == MT_BF16) {
        st = mt_device_alloc(u->dev, u->padded * es, MT_MEM_COMM, &u->rs_send);
        if (st == MT_OK)
            st = mt_op_cast(u->dev, u->full_grad, MT_F32, u->rs_send, MT_BF16, u->padded);
        send = u->rs_send;
    }
    if (st == MT_OK && u->S > 0 && wants_squares(u)) {
        u->grad_sq_asked = true;
        st = mt_reduce_scatter_squares(u->shard, send, u->rs_recv, u->S, MT_REDUCE_AVG,
                                       &(mt_reduce_squares){u->grad_sq, u->S}, &u->rs_work);
    } else if (st == MT_OK && u->S > 0) {
        st = mt_reduce_scatter(u->shard, send, u->rs_recv, u->S, u->reduce_dtype, MT_REDUCE_AVG,
                               &u->rs_work);
    }
    if (st != MT_OK) {
        mt_error_wrap(st, "reduce-scatter of the gradients of %s over '%s'",
                      mt_fsdp_unit_desc(u, desc, sizeof desc), u->shard_dim);
        mt_device_free(u->dev, u->rs_send);
        if (u->rs_in_shard) rs_in_shard_undo(u);
        else mt_device_free(u->dev, u->rs_recv);
        /* Nothing will reduce the full gradient now (the model refuses every later pass), so it
         * goes with the staging instead of staying held until the model is destroyed. */
        if (!u->grad_aliased) mt_device_free(u->dev, u->full_grad);
        u->full_grad = NULL;
        u->rs_send = u->rs_recv = NULL;
        u->rs_in_shard = false;
        u->rs_work = NULL;
        return st;
    }
    u->debug.reduce_scatters++;
    r->rs_pending = u;
    if (++r->rs_outstanding > r->max_outstanding_rs) r->max_outstanding_rs = r->rs_outstanding;
    return MT_OK;
}

bool mt_fsdp_grads_alias(const mt_fsdp_unit *u) {
    return u->nranks == 1 && (!u->replicate || mt_group_size(u->replicate) == 1) &&
           u->reduce_dtype == MT_F32 && u->offload == MT_OFFLOAD_NONE && u->grad_shard_zero &&
           u->requires_sync;
}

/* The buffer the backward writes: the gradient shard itself where mt_fsdp_grads_alias allows
 * (at one rank the reduce-scatter would be a copy and the accumulation 0 + g, after a memset of
 * the whole unit: three passes over it for the same bits), else a full buffer that is not
 * zeroed: each parameter's slice is marked unwritten, so that its first writer overwrites it
 * (mt_param_grad_write) or mt_param_grad zeroes it, and the slices nobody wrote are zeroed when
 * the backward ends (zero_unwritten). Only the padding after the parameters is zeroed here: it
 * is reduced with the rest and must stay 0 in the shards. On a GPU the buffer is zeroed whole
 * and counts as written: there a first writer's zeroing would be a memset per gradient, each
 * waited for on the host (mt_device_memset with no stream), where one memset per unit is one
 * launch. */
static mt_status grad_buffer(mt_fsdp_unit *u) {
    if (mt_fsdp_grads_alias(u)) {
        u->grad_sq_valid = false;
        u->full_grad = u->grad_shard;
        u->grad_aliased = true;
        u->grad_shard_zero = false;
        if (u->grad_shard_lazy) {
            /* Zeros it does not hold (mt_zero_grad): marked unwritten like a full buffer
             * instead; at one rank the shard is the whole unit, with no padding to zero. */
            u->grad_shard_lazy = false;
            for (size_t i = 0; i < u->n_params; i++) u->params[i]->grad_unwritten = true;
            if (mt_debug_poison_grads())
                for (size_t i = 0; i < u->total; i++) u->full_grad[i] = NAN;
        }
        return MT_OK;
    }
    char desc[256];
    mt_status st = mt_device_alloc(u->dev, u->padded * sizeof(float), MT_MEM_GRADS,
                                   (void **)&u->full_grad);
    bool whole = mt_device_get_kind(u->dev) != MT_DEVICE_CPU;
    if (st == MT_OK && (whole || u->padded > u->total)) {
        size_t from = whole ? 0 : u->total;
        st = mt_device_memset(u->dev, u->full_grad + from, 0, (u->padded - from) * sizeof(float),
                              NULL);
    }
    for (size_t i = 0; st == MT_OK && !whole && i < u->n_params; i++)
        u->params[i]->grad_unwritten = true;
    if (st == MT_OK && !whole && mt_debug_poison_grads())
        for (size_t i = 0; i < u->total; i++) u->full_grad[i] = NAN;
    if (st != MT_OK) {
        mt_device_free(u->dev, u->full_grad);
        u->full_grad = NULL;
        return mt_error_wrap(st, "gradient buffer of %s", mt_fsdp_unit_desc(u, desc, sizeof desc));
    }
    return MT_OK;
}

/* The backward is over (failed: what it added is dropped) or its gradient is in the shard. */
static mt_status drop_grad_buffer(mt_fsdp_unit *u, bool failed) {
    mt_status st = MT_OK;
    if (!u->grad_aliased) {
        mt_device_free(u->dev, u->full_grad);
    } else if (failed) {
        /* The shard was all zeros when the alias began (mt_fsdp_grads_alias): zeros again are
         * what dropping a separate buffer would have left. */
        st = mt_device_memset(u->dev, u->grad_shard, 0, u->S * sizeof(float), NULL);
        u->grad_shard_zero = st == MT_OK;
        u->grad_shard_lazy = false;
    }
    u->full_grad = NULL;
    u->grad_aliased = false;
    return st;
}

static void point_grads(mt_fsdp_unit *u, bool valid) {
    for (size_t i = 0; i < u->n_params; i++) {
        u->params[i]->grad = valid ? u->full_grad + u->offsets[i] : NULL;
        if (!valid) u->params[i]->grad_unwritten = false;
    }
}

/* After a backward: the gradients of the parameters its module never fetched are zero (what the
 * zeroed buffer gave them before grad_buffer stopped zeroing it whole). */
static mt_status zero_unwritten(mt_fsdp_unit *u) {
    for (size_t i = 0; i < u->n_params; i++) {
        mt_param *p = u->params[i];
        if (!p->grad_unwritten) continue;
        MT_TRY(mt_device_memset(u->dev, u->full_grad + u->offsets[i], 0, p->numel * sizeof(float),
                                NULL));
        p->grad_unwritten = false;
    }
    return MT_OK;
}

static mt_status pre_backward(mt_module *module, void *unit) {
    (void)module;
    mt_fsdp_unit *u = unit;
    mt_fsdp_root *r = u->root;
    MT_TRY(pre_hook(u, true));
    u->backward_pass = r->pass;
    /* A unit run again in one pass while its own reduce-scatter is in flight: that collective
     * reads full_grad, so it finishes before the buffer is written (or dropped) again. */
    if (r->rs_pending == u) {
        mt_status st = finish_pending_rs(r);
        if (st != MT_OK) return mark_broken(r, st);
    }
    if (!u->full_grad) MT_TRY(grad_buffer(u));
    point_grads(u, true);
    u->in_backward = true;
    return MT_OK;
}

static mt_status post_backward(mt_module *module, void *unit, mt_status user_status) {
    (void)module;
    mt_fsdp_unit *u = unit;
    mt_fsdp_root *r = u->root;
    char saved[1024];
    if (user_status != MT_OK) snprintf(saved, sizeof saved, "%s", mt_last_error());
    mt_status st = MT_OK;
    if (user_status == MT_OK) {
        st = zero_unwritten(u);
        if (st != MT_OK) {
            char desc[256];
            mt_error_wrap(st, "zeroing the gradients the backward of %s did not write",
                          mt_fsdp_unit_desc(u, desc, sizeof desc));
            user_status = st;
            snprintf(saved, sizeof saved, "%s", mt_last_error());
        }
    }
    point_grads(u, false);
    u->in_backward = false;
    /* A rank whose backward failed issues no reduce-scatter: the others find out by timeout or
     * by the launcher stopping the job, and this rank reports its own error. What the failed
     * backward added to the full gradient is partial: a later backward must not add to it (nor,
     * without sync, to what earlier micro-batches accumulated there, which it has spoilt). */
    if (user_status != MT_OK) {
        st = drop_grad_buffer(u, true);
    } else if (u->requires_sync) {
        st = finish_pending_rs(r);
        if (u->grad_aliased) { /* the gradient is in the shard already: nothing to reduce */
            mt_status s = drop_grad_buffer(u, false);
            if (st == MT_OK) st = s;
            u->debug.reduce_scatters++; /* the unit's gradient was reduced (in place) */
        } else if (st == MT_OK) {
            st = issue_rs(r, u);
        }
    }
    mt_status s = mt_fsdp_reshard(u);
    if (st == MT_OK) st = s;
    if (u == r->unit) {
        s = finish_pending_rs(r);
        if (st == MT_OK) st = s;
        s = mt_fsdp_offload_grads_landed(u); /* the host gradients are complete from here */
        if (st == MT_OK) st = s;
        s = reshard_all(r, false, user_status == MT_OK);
        if (st == MT_OK) st = s;
        if (!r->order[1].recorded && user_status == MT_OK) finish_recording(r, true);
    }
    if (st != MT_OK) mark_broken(r, st);
    if (user_status != MT_OK) return mt_error_restore(user_status, saved);
    return st;
}

const mt_module_hooks mt_fsdp_hooks = {
    .pre_forward = pre_forward,
    .post_forward = post_forward,
    .pre_backward = pre_backward,
    .post_backward = post_backward,
    .release = mt_fsdp_unit_destroy,
};
