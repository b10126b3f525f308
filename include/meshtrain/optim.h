/* AdamW on the local f32 master shards of an FSDP root's units (create it after sharding). */
#ifndef MESHTRAIN_OPTIM_H
#define MESHTRAIN_OPTIM_H

#include <meshtrain/api.h>
#include <meshtrain/module.h>
#include <meshtrain/status.h>

#include <stdbool.h>

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

/* The overlapped step (off by default; docs/offload.md "Overlapped optimizer step"). With it
 * on, an offloaded unit's host AdamW step starts on the optimizer's own thread as soon as its
 * reduced gradient shard has landed on the host, while the backward of earlier units goes on;
 * mt_adamw_step then waits for those steps and steps the units not yet stepped (resident units,
 * the root unit that lands at the end of the backward). Each unit's computation is the one
 * mt_adamw_step does without overlap, so the result is the same bits. What it needs:
 *  - some unit offloaded (mt_fsdp_options.offload), else MT_ERR_INVALID_ARG;
 *  - the learning rate set before the backward (mt_adamw_set_lr waits for started steps);
 *  - one synchronising backward per step (earlier micro-batches without gradient sync are
 *    fine); a second one before mt_adamw_step fails, naming the unit;
 *  - no clipping: mt_clip_grad_norm with max_norm > 0 is refused while the overlap is on (the
 *    units were stepped before the global norm existed); max_norm 0 still returns the norm.
 * A backward that fails after some units were stepped leaves them stepped. While the overlap is
 * on, the optimizer holds a hook in the model: destroy the optimizer before the model (or turn
 * the overlap off first). */
MT_API mt_status mt_adamw_set_overlap(mt_adamw *opt, bool on);
/* Units of the last mt_adamw_step whose step started while the backward still ran (0 without
 * overlap): what shows that the overlap happened. */
MT_API long mt_adamw_overlapped_units(const mt_adamw *opt);

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
