/* Modules: what users build models from, in llm.c's explicit style. A module owns named
 * parameters and child modules and provides a forward and a backward function; the program calls
 * mt_module_forward / mt_module_backward on the root, and each module's functions call them on
 * its children in execution order (backward: reverse order). Going through these calls is what
 * runs the hooks registered on a module (mt_module_add_hooks): FSDP's gather a unit's parameters
 * before it runs and shard them again afterwards.
 *
 * A parameter has a global shape and a placement on the mesh's tensor-parallel dimension
 * (MT_TP_DIM_DEFAULT, "tp"; mt_module_tp_dim): Replicate, or
 * Shard(dim) (each tp rank holds global_shape[dim] / tp rows of that dimension). The module holds
 * the tp-local part; its values are set after creation through mt_param_data (f32), before the
 * module is sharded. Data and gradients are valid only while the parameter's unit is unsharded
 * (inside its forward and backward); gradients are f32 and accumulate (+=), except that the first
 * write of a gradient FSDP did not zero may overwrite it (mt_param_grad_write).
 *
 * Deferred initialisation (include/meshtrain/init.h): a parameter created with
 * mt_module_add_param_deferred has a shape and a placement but no storage, so a model larger
 * than one device can be built, sharded with FSDP (the unit allocates only this rank's shard) and
 * then initialised shard by shard (mt_param_init, mt_module_init_params), or loaded from a
 * checkpoint, which counts as initialising. Its forward, its unit's gathering and the optimizer's
 * first step refuse it, naming it, until it has values.
 */
#ifndef MESHTRAIN_MODULE_H
#define MESHTRAIN_MODULE_H

#include <meshtrain/api.h>
#include <meshtrain/dtype.h>
#include <meshtrain/mesh.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MT_PARAM_MAX_DIMS 4

/* The name of the mesh dimension that tp placements (and tp.h's layers) refer to. A mesh without
 * it has tp size 1. */
#define MT_TP_DIM_DEFAULT "tp"

typedef struct mt_module mt_module;
typedef struct mt_param mt_param;

typedef enum mt_tp_kind { MT_TP_REPLICATE = 0, MT_TP_SHARD = 1 } mt_tp_kind;

/* How a parameter is split over the mesh's tp dimension. */
typedef struct mt_tp_placement {
    mt_tp_kind kind;
    int dim; /* with MT_TP_SHARD: the dimension split across tp ranks */
} mt_tp_placement;

/* A module's own step: ctx is whatever the program passes to mt_module_forward/backward (inputs,
 * activations, loss); the module reads its parameters and writes its gradients through them. */
typedef mt_status (*mt_module_fn)(mt_module *module, void *ctx);

typedef struct mt_module_ops {
    mt_module_fn forward;
    mt_module_fn backward;
    /* Optional: frees what the forward saved for the backward, keeping the module's output (the
     * next module reads it) and whatever it read as input. A module with it also accepts a
     * second forward with the same ctx, after discard or not, which saves it all again (freeing
     * or reusing what is there) and computes the same values: activation recompute (recompute.h)
     * runs one before the backward. A module without it cannot recompute. */
    mt_module_fn discard;
} mt_module_ops;

/* Creates a module on the mesh's runtime and device. ops is copied; user is the module's own
 * state (mt_module_user). name is used in messages. */
MT_API
mt_status mt_module_create(mt_mesh *mesh, const char *name, const mt_module_ops *ops, void *user,
                           mt_module **out);

/* Destroys a module and its children: first each hook registration's release (latest
 * registration first), then the children, then the parameters. Only a module without a parent
 * is destroyed: for a child it logs an error and does nothing (destroy the root). */
MT_API void mt_module_destroy(mt_module *module);

/* Adds child as the next child of parent (children run in the order the parent calls them; this
 * order only names them). A module has at most one parent, and names are unique in a tree: a
 * child (or a module below it) named like a module of parent's tree is refused. */
MT_API mt_status mt_module_add_child(mt_module *parent, mt_module *child);

/* Adds a parameter of the given global shape and tp placement; its tp-local values are allocated
 * on the device (category params), zeroed, as f32. Only before the module, or a module above
 * it, is sharded (mt_fsdp_shard fixes the parameters of its subtree); the same for children. */
MT_API
mt_status mt_module_add_param(mt_module *module, const char *name, int ndim,
                              const int64_t *global_shape, mt_tp_placement tp, mt_param **out);

/* Like mt_module_add_param, but nothing is allocated: the parameter holds no values until an
 * initialiser runs on it (init.h: on this rank's FSDP shard once sharded, else allocating its
 * tp-local part) or a checkpoint is loaded into it. mt_param_data is NULL meanwhile. */
MT_API
mt_status mt_module_add_param_deferred(mt_module *module, const char *name, int ndim,
                                       const int64_t *global_shape, mt_tp_placement tp,
                                       mt_param **out);

/* Runs the module's forward / backward: its pre hooks in registration order, its own function
 * (without one: its children's, backward in reverse order), then its post hooks in reverse
 * registration order, so that registrations nest like wrappers (the first one registered is the
 * outermost). A pre hook that fails stops the call: the hooks registered after it do not run, the
 * post hooks of those registered before it do (given the failure), and the failure is returned. */
MT_API mt_status mt_module_forward(mt_module *module, void *ctx);
MT_API mt_status mt_module_backward(mt_module *module, void *ctx);

/* ---- hooks: what libraries (FSDP, checkpointing, offload) and users put around a module ---- */

/* Runs before the module's forward / backward; user is the registration's. A failure stops the
 * call; mt_last_error then says what failed: the message the library set while the hook ran
 * (e.g. a failed collective inside it), or else "a pre-forward hook of module 'x' failed". */
typedef mt_status (*mt_module_pre_hook)(mt_module *module, void *user);
/* Runs after it; status is the outcome so far (the module's own function, then the post hooks
 * that ran before this one). Returns the new outcome. Returning a failed status unchanged keeps
 * its message, whatever the hook did meanwhile; a new failure is reported like a pre hook's. */
typedef mt_status (*mt_module_post_hook)(mt_module *module, void *user, mt_status status);
/* Ends a registration (mt_module_remove_hooks or mt_module_destroy): frees what user holds. */
typedef void (*mt_module_release_fn)(mt_module *module, void *user);

/* Any member may be NULL. */
typedef struct mt_module_hooks {
    mt_module_pre_hook pre_forward;
    mt_module_post_hook post_forward;
    mt_module_pre_hook pre_backward;
    mt_module_post_hook post_backward;
    mt_module_release_fn release;
} mt_module_hooks;

/* Registers hooks on module under owner (any address that identifies the caller, e.g. a static
 * object of the library; at most one registration per owner and module). hooks is copied; user
 * goes to every hook and to release. Not while the module is running. */
MT_API
mt_status mt_module_add_hooks(mt_module *module, const void *owner, const mt_module_hooks *hooks,
                              void *user);

/* Removes owner's registration from module and calls its release. MT_ERR_INVALID_ARG when owner
 * has none there, or while the module is running. */
MT_API mt_status mt_module_remove_hooks(mt_module *module, const void *owner);

/* The user pointer of owner's registration on module; NULL when it has none. */
MT_API void *mt_module_hooks_user(const mt_module *module, const void *owner);

MT_API void *mt_module_user(const mt_module *module);
MT_API const char *mt_module_name(const mt_module *module);
MT_API mt_mesh *mt_module_mesh(const mt_module *module);
/* The mesh dimension the module's tp placements refer to (MT_TP_DIM_DEFAULT unless set). */
MT_API const char *mt_module_tp_dim(const mt_module *module);
/* Places the module's parameters on another mesh dimension than MT_TP_DIM_DEFAULT (a mesh named
 * {"data", "model"}, say). Right after mt_module_create: before parameters, children or a parent;
 * a child must use its parent's dimension. A mesh without that dimension means tp size 1. */
MT_API mt_status mt_module_set_tp_dim(mt_module *module, const char *dim);
MT_API size_t mt_module_child_count(const mt_module *module);
MT_API mt_module *mt_module_child(const mt_module *module, size_t i);
MT_API size_t mt_module_param_count(const mt_module *module);
MT_API mt_param *mt_module_param(const mt_module *module, size_t i);

MT_API const char *mt_param_name(const mt_param *param);
MT_API int mt_param_ndim(const mt_param *param);
/* Global and tp-local sizes of dimension d. */
MT_API int64_t mt_param_global_dim(const mt_param *param, int d);
MT_API int64_t mt_param_local_dim(const mt_param *param, int d);
/* Elements of the tp-local part. */
MT_API size_t mt_param_numel(const mt_param *param);
MT_API mt_tp_placement mt_param_tp(const mt_param *param);
/* Declares the global rows [real_rows, global_shape[0]) padding: rows a model keeps at zero to
 * make dimension 0 divide evenly (a vocabulary padded to a multiple of tp). They are not part of
 * the model's state: a checkpoint stores real_rows rows, so that models with different padding
 * (another tp size) load each other's checkpoints. Before the module is sharded. */
MT_API mt_status mt_param_set_padding(mt_param *param, int64_t real_rows);
/* Rows of dimension 0 that are not padding (global_shape[0] unless set). */
MT_API int64_t mt_param_real_rows(const mt_param *param);

/* True for a deferred parameter that has no values yet (never initialised nor loaded). */
MT_API bool mt_param_needs_init(const mt_param *param);

/* The tp-local values, in the module's device memory: f32 before sharding; while the unit is
 * unsharded, in the unit's param_dtype (f32 or bf16). NULL while sharded. */
MT_API void *mt_param_data(mt_param *param);
MT_API mt_dtype mt_param_dtype(const mt_param *param);
/* The values as f32 (mt_param_data typed), or NULL with the last error saying why: the unit is
 * sharded, or its param_dtype is bf16 (then read them with mt_param_data as mt_bf16, or convert
 * with mt_param_read_f32). Module code that computes in f32 uses this to fail clearly instead of
 * reading bf16 bits as floats. */
MT_API float *mt_param_f32(mt_param *param);
/* The values as f32 into dst (mt_param_numel elements of the module's device memory; copy them
 * to the host with mt_device_copy), whatever the dtype. */
MT_API mt_status mt_param_read_f32(mt_param *param, float *dst);
/* The f32 gradient to accumulate into during the unit's backward; NULL outside it (or, with the
 * last error saying why, when zeroing it failed: see mt_param_grad_write). */
MT_API float *mt_param_grad(mt_param *param);
/* The same gradient for a backward whose first op on it can overwrite instead of adding (the ops'
 * _into forms in ops.h). *overwrite says which: true when the buffer holds no gradient yet (FSDP
 * does not zero its full gradient buffers; the contents are undefined, so the caller must write
 * every element, in overwrite mode or by zeroing it first); false when it holds one to add to
 * (accumulation over micro-batches, an unsharded model, a second write in this backward). Either
 * way the gradient counts as written from here, and a later mt_param_grad or mt_param_grad_write
 * adds. mt_param_grad zeroes an unwritten gradient itself, and FSDP zeroes those nobody
 * fetched when the unit's backward ends, so modules that only add need not know any of this. */
MT_API float *mt_param_grad_write(mt_param *param, bool *overwrite);

#ifdef __cplusplus
}
#endif
#endif
