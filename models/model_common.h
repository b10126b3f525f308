/* Internal helpers shared by the reference models (models/gpt.c, models/mlp.c): per-pass device
 * buffers, the values and gradients of parameters inside a module function, and child modules.
 * (Their seed-defined initial values come from the library's initialisers, include/meshtrain/
 * init.h.) */
#ifndef MT_MODELS_MODEL_COMMON_H
#define MT_MODELS_MODEL_COMMON_H

#include <meshtrain/device.h>
#include <meshtrain/module.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A device buffer of elems floats (activations category), zeroed when zero (else left as the
 * allocation had it, or NaN under MT_DEBUG_POISON_GRADS=1: core/debug_poison.h); at least one
 * element, so that an empty buffer is still a valid pointer. */
mt_status mt_model_act_alloc(mt_device *dev, size_t elems, bool zero, float **out);

/* Frees bufs[0..n) and sets each to NULL. */
void mt_model_free_all(mt_device *dev, float **bufs, size_t n);

/* The values of params[0..n): their own data when f32 or when matmul[i] (a weight that only
 * enters matrix products, which take bf16 directly: the _ex linears; dtypes[i] says which), else
 * f32 copies converted into scratch[i] (activations; free with mt_model_free_all, also after an
 * error). matmul may be NULL (every value as f32). model names the model in messages. */
mt_status mt_model_param_values(mt_device *dev, const char *model, mt_param **params, int n,
                                const bool *matmul, const void **vals, mt_dtype *dtypes,
                                float **scratch);

/* The gradient buffers of params[0..n) into grads; an error naming the model, the module and the
 * parameter when one has none (the module was not sharded with mt_fsdp_shard). With fresh
 * (mt_model_param_grads_write), fresh[i] says that grads[i] holds no gradient yet and its first
 * op must overwrite it (mt_param_grad_write); without, every buffer is ready to add into. */
mt_status mt_model_param_grads_write(const char *model, const mt_module *module,
                                     mt_param **params, int n, float **grads, bool *fresh);
mt_status mt_model_param_grads(const char *model, const mt_module *module, mt_param **params,
                               int n, float **grads);

/* Creates the module `name` as a child of parent (destroyed again when it cannot be added). */
mt_status mt_model_add_child(mt_mesh *mesh, mt_module *parent, const char *name,
                             const mt_module_ops *ops, void *user, mt_module **out);

#endif
