/* Internal: the module tree's objects, shared by module/ and the libraries built on it (fsdp/,
 * and next checkpointing, CPU offload, activation checkpointing). What such a library keeps per
 * module it attaches through a hook registration (mt_module_add_hooks' user, found again with
 * mt_module_hooks_user), never as fields here; what is here is the tree's own state, including
 * that of a call in progress (ctx, recomputing), which any library's hooks may read. */
#ifndef MT_MODULE_MODULE_INTERNAL_H
#define MT_MODULE_MODULE_INTERNAL_H

#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/init.h>
#include <meshtrain/mesh.h>
#include <meshtrain/module.h>

#include <stdbool.h>
#include <stddef.h>

struct mt_param {
    char *name;
    mt_module *owner;
    int ndim;
    int64_t global_shape[MT_PARAM_MAX_DIMS];
    int64_t local_shape[MT_PARAM_MAX_DIMS];
    mt_tp_placement tp;
    size_t numel;
    /* Before sharding: its own f32 allocation (own_data, category params). After a library took
     * the values over (FSDP): a view into that library's buffer, or NULL while not materialised;
     * dtype says what the view holds. */
    void *data;
    bool own_data;
    mt_dtype dtype;
    float *grad; /* a view to accumulate into during the backward that provides one; else NULL */
    /* The view holds no gradient yet and was not zeroed (FSDP's full gradient buffer): its first
     * writer overwrites it (mt_param_grad_write), or mt_param_grad zeroes it before handing it
     * out, so that a module that only adds sees zeros as before. */
    bool grad_unwritten;
    int64_t real_rows; /* global rows [real_rows, global_shape[0]) are padding (mt_param_set_padding) */
    /* Deferred initialisation (init.h): created without values; initialised once an initialiser
     * ran or a checkpoint was loaded. init is the recorded initialiser (has_init). */
    bool deferred, initialised, has_init;
    mt_initialiser init;
    /* Set by a library that took the values over (FSDP) for as long as it holds them: this
     * rank's part is the tp-local elements [held_begin, held_end) (row-major), stored as f32
     * device memory at held. After writing there, an initialiser calls held_written (FSDP
     * refreshes its bf16 copy of that range). held_by says who, for messages. */
    const char *held_by;
    float *held;
    size_t held_begin, held_end;
    mt_status (*held_written)(mt_param *param, void *ctx);
    void *held_ctx;
};

/* mt_param_grad_write (module.h) with a status: *grad is NULL when the parameter has no gradient
 * buffer (MT_OK) or when zeroing an unwritten one failed (the error). overwrite may be NULL. */
mt_status mt_param_grad_get(mt_param *param, bool *overwrite, float **grad);

/* One registration of mt_module_add_hooks. */
typedef struct mt_module_hook_entry {
    const void *owner;
    mt_module_hooks hooks;
    void *user;
} mt_module_hook_entry;

struct mt_module {
    char *name;
    mt_mesh *mesh;
    mt_device *dev;
    char *tp_dim; /* the mesh dimension tp placements refer to (owned copy) */
    mt_module_ops ops;
    void *user;
    mt_module *parent;
    mt_module **children;
    size_t n_children, cap_children;
    mt_param **params;
    size_t n_params, cap_params;
    mt_module_hook_entry *hooks; /* in registration order */
    size_t n_hooks, cap_hooks;
    int running; /* forward/backward calls in progress: hooks cannot change meanwhile */
    void *ctx;   /* the ctx of the innermost call in progress (a hook has no other way to it) */
    /* Forwards in progress that re-run the module for its backward (activation recompute,
     * mt_module_forward_inner): libraries whose hooks ran in the first forward act differently
     * (FSDP neither reshards nor prefetches nor counts a pass); see mt_module_recomputing. */
    int recomputing;
    /* Set when a library fixed the parameters of this subtree in place (FSDP: "an FSDP unit"):
     * no parameter or child may be added at or below it. Says what, for messages. */
    const char *sealed_by;
    const char *sealed_hint; /* what to do instead, for messages */
};

/* True while module or a module above it runs a recompute forward (its subtree's hooks see a
 * forward whose backward follows at once). */
bool mt_module_recomputing(const mt_module *module);

/* Runs module's forward as the registrations after owner's see it (owner's and the earlier ones
 * are not run): their pre-forward hooks, the module's function, their post-forward hooks, with
 * module->recomputing set. Activation recompute calls it from its pre-backward hook: FSDP
 * registered after it (inner) then gathers for this forward; registered before it, FSDP's
 * pre-backward has already gathered. ctx goes to the module's function. */
mt_status mt_module_forward_inner(mt_module *module, const void *owner, void *ctx);

/* Ends every hook registration of module, latest first (mt_module_destroy). */
void mt_module_release_hooks(mt_module *module);

/* Fixes the structure of module's subtree (see sealed_by); by and hint must outlive the module
 * (string literals). */
void mt_module_seal(mt_module *module, const char *by, const char *hint);

/* MT_OK unless param is deferred and has no values yet: then MT_ERR_INVALID_ARG naming it and
 * saying that `what` (e.g. "gathering its FSDP unit") needs them. */
mt_status mt_param_check_ready(const mt_param *param, const char *what);

/* The mesh coordinate of module's tp dimension (0 when the mesh has none). */
int mt_module_tp_rank(const mt_module *module);

/* The closest module at or above module that is sealed, or NULL. */
const mt_module *mt_module_sealed_above(const mt_module *module);

#endif
