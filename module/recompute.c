/* Activation recompute (include/meshtrain/recompute.h): two hooks on the module. Post-forward
 * calls the module's discard (not after the re-run forward itself: its backward follows and
 * needs what it saved); pre-backward re-runs the forward through the registrations inside this
 * one (mt_module_forward_inner), so that a library registered later (FSDP) gathers for it. */
#include "module/module_internal.h"

#include "core/error.h"

#include <meshtrain/recompute.h>

/* The owner of recompute's hook registrations. */
static const char recompute_owner;

static mt_status post_forward(mt_module *module, void *user, mt_status status) {
    (void)user;
    if (status != MT_OK || mt_module_recomputing(module)) return status;
    mt_status st = module->ops.discard(module, module->ctx);
    if (st != MT_OK)
        return mt_error_wrap(st, "activation recompute: discarding the saved activations of "
                             "module '%s'", module->name);
    return MT_OK;
}

static mt_status pre_backward(mt_module *module, void *user) {
    (void)user;
    mt_status st = mt_module_forward_inner(module, &recompute_owner, module->ctx);
    if (st != MT_OK)
        return mt_error_wrap(st, "activation recompute: re-running the forward of module '%s' "
                             "for its backward", module->name);
    return MT_OK;
}

static const mt_module_hooks recompute_hooks = {
    .post_forward = post_forward,
    .pre_backward = pre_backward,
};

mt_status mt_recompute_enable(mt_module *module) {
    if (!module) return mt_error(MT_ERR_INVALID_ARG, "mt_recompute_enable: module is NULL");
    if (!module->ops.forward)
        return mt_error(MT_ERR_INVALID_ARG, "mt_recompute_enable: module '%s' has no forward "
                        "function of its own (it runs its children); enable activation "
                        "recompute on the children that have one", module->name);
    if (!module->ops.discard)
        return mt_error(MT_ERR_INVALID_ARG, "mt_recompute_enable: module '%s' has no discard "
                        "function; activation recompute needs a forward that can be re-run "
                        "after its saved activations were freed (mt_module_ops.discard)",
                        module->name);
    if (mt_recompute_enabled(module))
        return mt_error(MT_ERR_INVALID_ARG, "mt_recompute_enable: module '%s' already "
                        "recomputes its activations", module->name);
    /* A non-NULL user: mt_module_hooks_user tells a registration by it. */
    return mt_module_add_hooks(module, &recompute_owner, &recompute_hooks,
                               (void *)&recompute_owner);
}

mt_status mt_recompute_disable(mt_module *module) {
    if (!module) return mt_error(MT_ERR_INVALID_ARG, "mt_recompute_disable: module is NULL");
    if (!mt_recompute_enabled(module))
        return mt_error(MT_ERR_INVALID_ARG, "mt_recompute_disable: module '%s' does not "
                        "recompute its activations", module->name);
    return mt_module_remove_hooks(module, &recompute_owner);
}

bool mt_recompute_enabled(const mt_module *module) {
    return module && mt_module_hooks_user(module, &recompute_owner) != NULL;
}
