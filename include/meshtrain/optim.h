/* AdamW on the local f32 master shards of an FSDP root's units (create it after sharding). */
#ifndef MESHTRAIN_OPTIM_H
#define MESHTRAIN_OPTIM_H

#include <meshtrain/api.h>
#include <meshtrain/module.h>
#include <meshtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_adamw_options {
    float lr;           /* learning rate */
    float beta1, beta2; /* 0.9, 0.999 when both are 0 */
    float eps;          /* 1e-8 when 0 */
    float weight_decay; /* decoupled, applied as p -= lr * wd * p */
} mt_adamw_options;

typedef struct mt_adamw mt_adamw;

/* Creates the optimizer over root's unit and the units below it; its state (m, v: 8 bytes per
 * local shard element) is charged to the optimizer category. */
MT_API mt_status mt_adamw_create(mt_module *root, const mt_adamw_options *options, mt_adamw **out);

/* One step with bias correction on every local shard, then refreshes the units' low-precision
 * copies. Gradients must be complete (the backward that synchronises them has returned). The
 * optimizer's first step refuses a deferred parameter that was never initialised nor loaded,
 * naming it (module.h); creating the optimizer does not, so that a checkpoint can be loaded into
 * a deferred model and its optimizer together. */
MT_API mt_status mt_adamw_step(mt_adamw *opt);

MT_API void mt_adamw_set_lr(mt_adamw *opt, float lr);
/* Steps taken so far. */
MT_API long mt_adamw_steps(const mt_adamw *opt);
/* Sets the steps taken (bias correction continues from there): after restoring the state. */
MT_API void mt_adamw_set_steps(mt_adamw *opt, long steps);
/* The options in effect (defaults filled in). */
MT_API mt_adamw_options mt_adamw_get_options(const mt_adamw *opt);
/* The module the optimizer was created on. */
MT_API mt_module *mt_adamw_root(const mt_adamw *opt);

/* The state, for checkpoints (checkpoint.h) and inspection: one block per FSDP unit at or below
 * the root, in a fixed order (the units below a module before its own). Unit i's first and
 * second moments (m, v) are n f32 values each, in the device's memory (copy them with
 * mt_device_copy), element for element beside the unit's local master shard, padding
 * included. */
MT_API size_t mt_adamw_unit_count(const mt_adamw *opt);
MT_API mt_status mt_adamw_state(mt_adamw *opt, size_t unit, float **exp_avg, float **exp_avg_sq,
                                size_t *n);
MT_API void mt_adamw_destroy(mt_adamw *opt);

#ifdef __cplusplus
}
#endif
#endif
