/* Module hooks: the registrations of libraries and users around a module, and the
 * forward/backward entry points that run them around the module's own function. */
#include "module/module_internal.h"

#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mt_module_hook_entry *find_hooks(const mt_module *m, const void *owner, size_t *index) {
    for (size_t i = 0; i < m->n_hooks; i++)
        if (m->hooks[i].owner == owner) {
            if (index) *index = i;
            return &m->hooks[i];
        }
    return NULL;
}

/* Hooks run over m->hooks by index: changing the list in the middle of a call would skip or
 * repeat one. */
static mt_status check_not_running(const mt_module *m, const char *what) {
    if (m->running == 0) return MT_OK;
    return mt_error(MT_ERR_INVALID_ARG, "%s: module '%s' is running its forward or backward",
                    what, m->name);
}

mt_status mt_module_add_hooks(mt_module *module, const void *owner, const mt_module_hooks *hooks,
                              void *user) {
    if (!module || !owner || !hooks)
        return mt_error(MT_ERR_INVALID_ARG, "mt_module_add_hooks: module, owner and hooks are "
                                            "required");
    MT_TRY(check_not_running(module, "mt_module_add_hooks"));
    if (find_hooks(module, owner, NULL))
        return mt_error(MT_ERR_INVALID_ARG, "mt_module_add_hooks: module '%s' already has hooks "
                        "of this owner", module->name);
    if (module->n_hooks == module->cap_hooks) {
        size_t cap = module->cap_hooks ? module->cap_hooks * 2 : 2;
        mt_module_hook_entry *h = realloc(module->hooks, cap * sizeof *h);
        if (!h) return mt_error(MT_ERR_OUT_OF_MEMORY, "module '%s': out of host memory adding "
                                "hooks", module->name);
        module->hooks = h;
        module->cap_hooks = cap;
    }
    module->hooks[module->n_hooks++] = (mt_module_hook_entry){owner, *hooks, user};
    return MT_OK;
}

static void release(mt_module *m, const mt_module_hook_entry *e) {
    if (e->hooks.release) e->hooks.release(m, e->user);
}

mt_status mt_module_remove_hooks(mt_module *module, const void *owner) {
    if (!module || !owner)
        return mt_error(MT_ERR_INVALID_ARG, "mt_module_remove_hooks: module and owner required");
    MT_TRY(check_not_running(module, "mt_module_remove_hooks"));
    size_t i;
    mt_module_hook_entry *e = find_hooks(module, owner, &i);
    if (!e)
        return mt_error(MT_ERR_INVALID_ARG, "mt_module_remove_hooks: module '%s' has no hooks of "
                        "this owner", module->name);
    mt_module_hook_entry removed = *e;
    memmove(&module->hooks[i], &module->hooks[i + 1],
            (module->n_hooks - i - 1) * sizeof *module->hooks);
    module->n_hooks--;
    release(module, &removed);
    return MT_OK;
}

void *mt_module_hooks_user(const mt_module *module, const void *owner) {
    const mt_module_hook_entry *e = module ? find_hooks(module, owner, NULL) : NULL;
    return e ? e->user : NULL;
}

void mt_module_release_hooks(mt_module *module) {
    while (module->n_hooks > 0) {
        module->n_hooks--;
        release(module, &module->hooks[module->n_hooks]);
    }
    free(module->hooks);
    module->hooks = NULL;
    module->cap_hooks = 0;
}

/* ---- running a module ----------------------------------------------------------------------- */

/* Without a function of its own, a module runs its children: forward in order, backward in
 * reverse order. */
static mt_status run_children(mt_module *m, void *ctx, bool backward) {
    for (size_t k = 0; k < m->n_children; k++) {
        size_t i = backward ? m->n_children - 1 - k : k;
        MT_TRY(backward ? mt_module_backward(m->children[i], ctx)
                        : mt_module_forward(m->children[i], ctx));
    }
    return MT_OK;
}

static mt_status run_user(mt_module *m, void *ctx, bool backward) {
    mt_module_fn fn = backward ? m->ops.backward : m->ops.forward;
    if (!fn) return run_children(m, ctx, backward);
    const char *pass = backward ? "backward" : "forward";
    mt_error_clear_message(); /* an older message must not pass for this failure's */
    mt_status st = fn(m, ctx);
    if (st == MT_OK) return st;
    if (!mt_last_error()[0])
        return mt_error(st, "%s of module '%s' failed (%s) without a message (set one with "
                        "mt_error_set)", pass, m->name, mt_status_str(st));
    if (!strstr(mt_last_error(), m->name)) mt_error_wrap(st, "%s of module '%s'", pass, m->name);
    return st;
}

/* A hook that failed without a message of its own (a user's hook has no public way to set
 * one) is still reported with where it failed, never with an older, unrelated message: the
 * error is cleared before the hook runs. */
static mt_status hook_failed(mt_module *m, const char *which, mt_status st) {
    if (mt_last_error()[0]) return st;
    return mt_error(st, "a %s hook of module '%s' failed (%s)", which, m->name,
                    mt_status_str(st));
}

/* Pre hooks in order from registration `from`; *ran gets the index past the last registration
 * whose pre hook succeeded (or had none). */
static mt_status run_pre(mt_module *m, bool backward, size_t from, size_t *ran) {
    for (*ran = from; *ran < m->n_hooks; ++*ran) {
        const mt_module_hook_entry *e = &m->hooks[*ran];
        mt_module_pre_hook fn = backward ? e->hooks.pre_backward : e->hooks.pre_forward;
        if (!fn) continue;
        mt_error_clear_message();
        mt_status st = fn(m, e->user);
        if (st != MT_OK) return hook_failed(m, backward ? "pre-backward" : "pre-forward", st);
    }
    return MT_OK;
}

/* The post hooks of registrations [from, n), latest first, each given the outcome so far. A
 * failure that a hook passes on keeps its message whatever the hook logged meanwhile; a hook
 * that fails on its own is reported with its message. */
static mt_status run_post(mt_module *m, bool backward, size_t from, size_t n, mt_status st) {
    char saved[2048];
    while (n-- > from) {
        const mt_module_hook_entry *e = &m->hooks[n];
        mt_module_post_hook fn = backward ? e->hooks.post_backward : e->hooks.post_forward;
        if (!fn) continue;
        if (st != MT_OK) snprintf(saved, sizeof saved, "%s", mt_last_error());
        mt_error_clear_message();
        mt_status out = fn(m, e->user, st);
        if (out != MT_OK && out == st) mt_error_restore(st, saved);
        else if (out != MT_OK) hook_failed(m, backward ? "post-backward" : "post-forward", out);
        st = out;
    }
    return st;
}

/* A deferred parameter without values has nothing to compute with: refused
 * before any hook runs, naming it (FSDP's gathering checks its unit's the same way). */
static mt_status check_params_ready(const mt_module *m, bool backward) {
    for (size_t i = 0; i < m->n_params; i++)
        MT_TRY(mt_param_check_ready(m->params[i], backward ? "the module's backward"
                                                           : "the module's forward"));
    return MT_OK;
}

/* The registrations from `from` on around the module's function. */
static mt_status run_from(mt_module *m, void *ctx, bool backward, size_t from) {
    m->running++;
    void *outer_ctx = m->ctx;
    m->ctx = ctx;
    size_t ran = from;
    mt_status st = check_params_ready(m, backward);
    if (st == MT_OK) st = run_pre(m, backward, from, &ran);
    if (st == MT_OK) st = run_user(m, ctx, backward);
    st = run_post(m, backward, from, ran, st);
    m->ctx = outer_ctx;
    m->running--;
    return st;
}

static mt_status run(mt_module *m, void *ctx, bool backward) {
    if (!m)
        return mt_error(MT_ERR_INVALID_ARG, "%s: module is NULL",
                        backward ? "mt_module_backward" : "mt_module_forward");
    mt_status st = run_from(m, ctx, backward, 0);
    /* A root's call is a whole pass: its outcome tells mt_finalize whether this process is
     * failing (then it does not wait for ranks that may be stuck waiting for it). */
    if (!m->parent) {
        if (st != MT_OK) mt_failure_note(st, mt_last_error());
        else mt_failure_clear();
    }
    return st;
}

mt_status mt_module_forward(mt_module *module, void *ctx) { return run(module, ctx, false); }
mt_status mt_module_backward(mt_module *module, void *ctx) { return run(module, ctx, true); }

bool mt_module_recomputing(const mt_module *module) {
    for (const mt_module *m = module; m; m = m->parent)
        if (m->recomputing > 0) return true;
    return false;
}

mt_status mt_module_forward_inner(mt_module *module, const void *owner, void *ctx) {
    size_t mine;
    if (!find_hooks(module, owner, &mine))
        return mt_error(MT_ERR_INTERNAL, "module '%s': a recompute forward for an owner without "
                        "hooks there", module->name);
    module->recomputing++;
    mt_status st = run_from(module, ctx, false, mine + 1);
    module->recomputing--;
    return st;
}

