/* A rank's model in checkpoint terms (checkpoint/ckpt_plan.h). */
#include "checkpoint/ckpt_plan.h"

#include "core/error.h"

#include <meshtrain/comm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const mt_ckpt_kind_prefix[MT_CKPT_KINDS] = {"model/", "optim/exp_avg/",
                                                         "optim/exp_avg_sq/"};

/* The module path of p's owner below root, then p's name: "block0.attn.qkv.weight". */
static char *param_path(const mt_module *root, const mt_param *p) {
    size_t len = strlen(p->name) + 1;
    for (const mt_module *m = p->owner; m && m != root; m = m->parent) len += strlen(m->name) + 1;
    char *s = malloc(len);
    if (!s) return NULL;
    size_t at = len - 1;
    s[at] = '\0';
    size_t n = strlen(p->name);
    at -= n;
    memcpy(s + at, p->name, n);
    for (const mt_module *m = p->owner; m && m != root; m = m->parent) {
        s[--at] = '.';
        n = strlen(m->name);
        at -= n;
        memcpy(s + at, m->name, n);
    }
    return s;
}

void mt_ckpt_plan_free(mt_ckpt_plan *plan) {
    if (!plan) return;
    for (size_t i = 0; i < plan->n_units; i++) free(plan->units[i].layouts);
    for (size_t i = 0; i < plan->n_params; i++) free(plan->params[i].path);
    free(plan->units);
    free(plan->params);
    memset(plan, 0, sizeof *plan);
}

static mt_status fill_unit(mt_ckpt_plan *plan, const mt_module *root, size_t ui, mt_adamw *opt) {
    mt_ckpt_unit *cu = &plan->units[ui];
    mt_fsdp_unit *u = cu->unit;
    cu->first = plan->n_params;
    cu->count = u->n_params;
    cu->layouts = calloc(u->n_params ? u->n_params : 1, sizeof *cu->layouts);
    if (!cu->layouts) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    cu->lo = (size_t)u->rank * u->S;
    cu->hi = cu->lo + u->S;
    cu->buf[MT_CKPT_MODEL] = u->master;
    cu->host = u->offload != MT_OFFLOAD_NONE;
    if (opt) {
        size_t n = 0;
        MT_TRY(mt_adamw_state(opt, ui, &cu->buf[MT_CKPT_EXP_AVG], &cu->buf[MT_CKPT_EXP_AVG_SQ],
                              &n));
        if (n != u->S)
            return mt_error(MT_ERR_INVALID_ARG, "checkpoint: the optimizer's state of unit '%s' "
                            "has %zu elements, its shard %zu (an optimizer of another model?)",
                            u->module->name, n, u->S);
    }
    int tp_size = u->tp ? mt_group_size(u->tp) : 1;
    for (size_t i = 0; i < u->n_params; i++) {
        mt_param *p = u->params[i];
        mt_ckpt_param *cp = &plan->params[plan->n_params++];
        cp->unit = ui;
        cp->path = param_path(root, p);
        if (!cp->path) return mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
        mt_ckpt_param_layout *l = &cp->layout;
        l->ndim = p->ndim;
        memcpy(l->global_shape, p->global_shape, sizeof l->global_shape);
        l->tp_dim = p->tp.kind == MT_TP_SHARD ? p->tp.dim : -1;
        l->tp_size = tp_size;
        l->tp_rank = u->tp_rank;
        l->offset = u->offsets[i];
        cu->layouts[i] = *l;
        memcpy(cp->shape, p->global_shape, sizeof cp->shape);
        if (p->ndim > 0) cp->shape[0] = p->real_rows;
    }
    return MT_OK;
}

mt_status mt_ckpt_plan_build(mt_module *root, mt_adamw *opt, mt_ckpt_plan *out) {
    memset(out, 0, sizeof *out);
    if (!root) return mt_error(MT_ERR_INVALID_ARG, "checkpoint: root must not be NULL");
    mt_fsdp_unit *ru = mt_fsdp_unit_of(root);
    if (!ru)
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: module '%s' is not an FSDP unit (shard "
                        "the model with mt_fsdp_shard, the root last, before saving or loading)",
                        mt_module_name(root));
    if (opt && mt_adamw_root(opt) != root)
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: the optimizer was created on module "
                        "'%s', not on '%s'", mt_module_name(mt_adamw_root(opt)),
                        mt_module_name(root));
    mt_fsdp_unit **units = NULL;
    size_t n = 0;
    MT_TRY(mt_fsdp_units_below(root, &units, &n));
    if (opt && mt_adamw_unit_count(opt) != n) {
        free(units);
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: the optimizer covers %zu units, module "
                        "'%s' has %zu", mt_adamw_unit_count(opt), mt_module_name(root), n);
    }
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += units[i]->n_params;
    out->units = calloc(n ? n : 1, sizeof *out->units);
    out->params = calloc(total ? total : 1, sizeof *out->params);
    mt_status st = out->units && out->params
                       ? MT_OK
                       : mt_error(MT_ERR_OUT_OF_MEMORY, "checkpoint: out of host memory");
    out->n_units = n;
    out->dev = ru->dev;
    out->has_optimizer = opt != NULL;
    out->replica_writer = !ru->replicate || mt_group_rank(ru->replicate) == 0;
    for (size_t i = 0; i < n && st == MT_OK; i++) {
        out->units[i].unit = units[i];
        /* Between steps a unit may still be unsharded (the root after a forward-only pass
         * keeps its parameters gathered): the master shard is what counts, and a load reshards
         * first. Inside a forward or backward the shards are in use. */
        if (units[i]->module->running || units[i]->in_backward)
            st = mt_error(MT_ERR_INVALID_ARG, "checkpoint: unit '%s' is inside its forward or "
                          "backward: save and load between steps", units[i]->module->name);
        else
            st = fill_unit(out, root, i, opt);
    }
    free(units);
    if (st != MT_OK) mt_ckpt_plan_free(out);
    return st;
}

bool mt_ckpt_plan_writes(const mt_ckpt_plan *plan, size_t i) {
    if (!plan->replica_writer) return false;
    return plan->params[i].layout.tp_dim >= 0 || plan->params[i].layout.tp_rank == 0;
}

bool mt_ckpt_clip_box(const mt_ckpt_plan *plan, size_t i, mt_ckpt_box *box) {
    int64_t real = plan->params[i].shape[0];
    if (box->ndim < 1 || box->offset[0] + box->extent[0] <= real) return true;
    if (box->offset[0] >= real) return false;
    size_t row = box->count / (size_t)box->extent[0];
    box->extent[0] = real - box->offset[0];
    box->count = row * (size_t)box->extent[0];
    return true;
}

const char *mt_ckpt_tensor_name(const mt_ckpt_plan *plan, size_t param, mt_ckpt_kind kind,
                                char *buf, size_t cap) {
    snprintf(buf, cap, "%s%s", mt_ckpt_kind_prefix[kind], plan->params[param].path);
    return buf;
}
