/* Internal: what the optimizer and gradient clipping see of an FSDP root: each unit's local
 * shard. Written by the engine (fsdp/), read by fsdp/optim_adamw.c and fsdp/clip.c. */
#ifndef MT_FSDP_FSDP_SHARDS_H
#define MT_FSDP_FSDP_SHARDS_H

#include <meshtrain/comm.h>
#include <meshtrain/device.h>
#include <meshtrain/module.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

/* A run of shard elements [begin, end) that belongs to one parameter. */
typedef struct mt_fsdp_range {
    size_t begin, end;
    bool tp_replicated; /* the parameter is Replicate on tp: every tp rank holds the same values */
} mt_fsdp_range;

/* param and grad are device memory (on a GPU not readable from the host): read and change them
 * through ops (include/meshtrain/ops.h), mt_device_copy and mt_device_memset only; unless host
 * is set (an offloaded unit): then they are host-tier blocks (host_memory.h), host memory on
 * every backend, read and changed by host code (the CPU kernels). */
typedef struct mt_fsdp_shard_view {
    const char *unit_name;
    float *param;  /* the f32 master shard: n elements */
    float *grad;   /* the sharded gradient: n elements (zeros until a backward synchronises) */
    size_t n;      /* shard elements, padding included (padding stays 0 in param and grad) */
    const mt_fsdp_range *ranges; /* the real (non-padding) elements, ascending */
    size_t n_ranges;
    bool host;     /* param and grad are in the device's host tier (offloaded unit) */
    /* The gradient is grad[i] * grad_scale: 1, except in mt_fsdp_collect_shards_for_step's
     * views of a shard whose clipping factor was deferred (mt_fsdp_scale_grads). */
    float grad_scale;
    /* The sums of squares of grad[0..n), one per MT_SQ_CHUNK elements from 0, as
     * mt_op_sum_squares over the whole shard computes them (core/cpu/sum_squares.h), when the
     * reduce-scatter that wrote the shard took them and nothing changed it since (CPU device);
     * else NULL. As of the collection. */
    const double *grad_sq;
} mt_fsdp_shard_view;

/* The shards of root's unit and of every unit below it, in a fixed order (depth-first, the
 * units below a module before its own: the sharding order of "layers first, then the root").
 * *views is malloc'd (caller frees the array only). MT_ERR_INVALID_ARG when root is not an FSDP
 * unit. The gradients read as of this call: mt_zero_grad only marks a CPU shard as zeros
 * (grad_shard_lazy), which this call writes, so a reader collects again after it. */
mt_status mt_fsdp_collect_shards(mt_module *root, mt_fsdp_shard_view **views, size_t *n);

/* The same views for the optimizer's step, which reads each gradient once: a clipping factor
 * that mt_fsdp_scale_grads deferred stays unwritten and is in view.grad_scale, for the step to
 * multiply as it reads (mt_cpu_op_adamw_scaled); the shard keeps standing for the scaled values
 * (a later reader of mt_fsdp_collect_shards gets them written). */
mt_status mt_fsdp_collect_shards_for_step(mt_module *root, mt_fsdp_shard_view **views,
                                          size_t *n);

/* Multiplies every gradient shard of root's units by c (gradient clipping), with the bits of
 * mt_op_scale on each. A resident shard on the CPU device is not written now: the factor is kept
 * on the unit (grad_scale) and applied by the optimizer's step as it reads the shard,
 * saving a pass over the gradients; a shard of zeros is left alone (0 * c is 0). */
mt_status mt_fsdp_scale_grads(mt_module *root, float c);

/* The groups of root's unit: the shard group, the replicate group (NULL without HSDP) and the
 * tp group of root's tp dimension (NULL when the mesh has none: mt_module_tp_dim), and this rank's tp coordinate. */
mt_status mt_fsdp_groups(mt_module *root, mt_group **shard, mt_group **replicate, mt_group **tp,
                         int *tp_rank);

/* After the optimizer changed the master shards: refresh the low-precision copies (bf16). */
mt_status mt_fsdp_shards_updated(mt_module *root);

/* MT_OK when every parameter of root's units holds values; else the error of the first deferred
 * one that was never initialised nor loaded, saying that `what` needs it. */
mt_status mt_fsdp_check_initialised(mt_module *root, const char *what);

/* After a checkpoint was loaded into every shard of root's model: its deferred parameters count
 * as initialised (a resumed model never runs its initialisers). Fails only when the units cannot
 * be listed (root not a unit, out of host memory): then nothing is marked. */
mt_status mt_fsdp_mark_loaded(mt_module *root);

/* The device of root (for allocations charged to the optimizer category). */
mt_device *mt_fsdp_device(mt_module *root);

/* Called on the thread running the backward once an offloaded unit's reduced gradient shard is
 * complete in its host gradient. view is that unit's own view (kept by the engine, valid until
 * the next call; the hook copies what it keeps), index its position among the count units that
 * mt_fsdp_collect_shards lists for the model's outermost unit. Only that unit's parameter copy
 * was quiesced (mt_fsdp_collect_shards quiesces every unit, which would wait for the staging that
 * runs ahead of the backward). backward_continues: false for the landing at the end of the
 * backward. Only a synchronising backward lands gradients. An error fails the backward. */
typedef mt_status (*mt_fsdp_grad_landed_fn)(void *arg, const mt_fsdp_shard_view *view,
                                            size_t index, size_t count,
                                            bool backward_continues);

/* Called on the thread starting a forward pass at the model's outermost unit (not a recompute),
 * before anything of the pass is gathered or staged, while the grad_landed hook is installed:
 * work the hook started on the units' shards must end here (an overlapped optimizer step writes
 * its unit's master, which the pass stages and gathers). An error fails the forward. */
typedef mt_status (*mt_fsdp_pass_begin_fn)(void *arg);

/* Installs (fn non-NULL; begin may be NULL) or removes the hooks of root's model. While
 * installed, mt_clip_grad_norm with max_norm > 0 is refused: the hook may have used the
 * gradients. */
mt_status mt_fsdp_set_grad_landed(mt_module *root, mt_fsdp_grad_landed_fn fn,
                                  mt_fsdp_pass_begin_fn begin, void *arg);

/* Whether root's model has the hook installed (false when root is not an FSDP unit). */
bool mt_fsdp_grad_landed_installed(mt_module *root);

#endif
