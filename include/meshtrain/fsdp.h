/* FSDP: fully sharded data parallelism over a mesh dimension, in the manner of PyTorch's FSDP2.
 *
 *   for (l = 0; l < layers; l++) mt_fsdp_shard(layer[l], &o);   // each layer a unit
 *   mt_fsdp_shard(root, &o);                                    // the root owns the rest
 *   mt_adamw_create(root, ...);                                 // after sharding: local shards
 *
 * A unit keeps its parameters in one flat buffer, padded so that every rank's shard has the same
 * size. Before the unit runs (forward or backward) one all-gather rebuilds the full buffer and
 * the parameters become views into it; afterwards it is freed (reshard). In backward the unit's
 * full gradient is reduce-scattered (average) over the shard dimension as soon as its backward is
 * done (HSDP: then all-reduced over the replicate dimension) and added to the sharded gradient.
 * The next unit's all-gather is prefetched in execution order (recorded on the first step), and
 * at most one reduce-scatter is outstanding, as FSDP2 does.
 *
 * Memory: unsharded parameters are charged to params, full and sharded gradients to grads, the
 * optimizer's state to optimizer, staging buffers to comm. With param_dtype f32 the sharded
 * parameter is the f32 master itself; with bf16 the unit keeps a bf16 shard (params) beside the
 * f32 master (optimizer). With an offload policy (mt_fsdp_options.offload) the master, the
 * gradient shard and the optimizer's state are in the device's host tier instead (host_memory.h,
 * docs/offload.md), moved by staging copies (stage.h).
 */
#ifndef MESHTRAIN_FSDP_H
#define MESHTRAIN_FSDP_H

#include <meshtrain/api.h>
#include <meshtrain/dtype.h>
#include <meshtrain/mesh.h>
#include <meshtrain/module.h>
#include <meshtrain/status.h>

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where a unit keeps its shards between uses (docs/offload.md). */
typedef enum mt_offload {
    MT_OFFLOAD_NONE = 0,  /* everything on the device */
    MT_OFFLOAD_OPTIMIZER, /* f32 master, gradient shard and AdamW state in the host tier
                             (host_memory.h); the device keeps the param_dtype shard the
                             all-gathers read, refreshed after each optimizer step */
    MT_OFFLOAD_FULL       /* parameters, gradients and optimizer state in the host tier; the
                             device holds a unit's shard only while its all-gather reads it */
} mt_offload;

typedef struct mt_fsdp_options {
    mt_mesh *mesh;
    const char *shard_dim;     /* the dimension parameters are sharded over ("dp") */
    const char *replicate_dim; /* HSDP: the dimension shards are replicated over; NULL for FSDP */
    int reshard_after_forward; /* 1, 0, or -1 (default): true for every unit but the root */
    mt_dtype param_dtype;      /* all-gathered and computed in: MT_F32 (default) or MT_BF16 */
    mt_dtype reduce_dtype;     /* gradients reduced in: MT_F32 (default) or MT_BF16 */
    mt_offload offload;        /* MT_OFFLOAD_NONE (default) */
    /* With offload: the fraction of units offloaded, in [0, 1] (default 1). Counting the units
     * a device shards with an offload policy in sharding order (layers first, then the root)
     * from k = 0, unit k is offloaded when floor((k + 1) * ratio) > floor(k * ratio): the
     * offloaded units are spread evenly, and the rest stay resident on the device. k counts
     * per model: it starts again from 0 after a module without a parent (a model's root) is
     * sharded, and a unit whose mt_fsdp_shard failed gives its k back. */
    float offload_ratio;
    /* On the CPU device, with every rank of the shard group on one host: an f32 unit whose shard
     * is at least 1 MiB is padded to whole pages and gathered by mapping every rank's shard
     * into one address range (no copy, no full buffer; the all-gather becomes a barrier).
     * true by default; false always copies. Falls back to copies, with a debug log line, where
     * a rank cannot map (shared memory off, another host, the kernel refusing pidfd_getfd). */
    bool mapped_gather;
} mt_fsdp_options;

/* Defaults: f32 everywhere, reshard after forward except the root, no replicate dimension, no
 * offload (ratio 1 once a policy is set), mapped gathers where possible. */
MT_API mt_fsdp_options mt_fsdp_defaults(mt_mesh *mesh, const char *shard_dim);

/* Makes module an FSDP unit owning every parameter of its subtree that no unit below owns.
 * Shard the layers first, then the root. */
MT_API mt_status mt_fsdp_shard(mt_module *module, const mt_fsdp_options *options);

/* With false, backward keeps accumulating the unsharded gradients of every unit instead of
 * reduce-scattering them (micro-batches before the last one of an accumulation); the cost is one
 * full f32 gradient buffer per unit kept until the next synchronising backward. Applies to
 * module's unit and every unit below it. */
MT_API mt_status mt_fsdp_set_requires_gradient_sync(mt_module *module, bool sync);

/* Explicit prefetch for a unit, as FSDP2's set_modules_to_forward_prefetch /
 * set_modules_to_backward_prefetch: the units whose all-gather starts when this unit starts its
 * forward (backward). Replaces the recorded order for this unit. */
MT_API mt_status mt_fsdp_set_forward_prefetch(mt_module *unit, mt_module *const *units, int n);
MT_API mt_status mt_fsdp_set_backward_prefetch(mt_module *unit, mt_module *const *units, int n);

/* Turns prefetching on or off for root's unit and every unit below (on by default): off, each
 * all-gather is issued when its unit starts (for comparison). */
MT_API mt_status mt_fsdp_set_prefetch(mt_module *root, bool enabled);

/* Scales every gradient shard so that the global L2 norm over all shards and mesh dimensions is
 * at most max_norm (TP-replicated parameters counted once); *norm (may be NULL) gets the norm
 * before clipping. Collective over the mesh. max_norm <= 0: only computes the norm. */
MT_API mt_status mt_clip_grad_norm(mt_module *root, float max_norm, float *norm);

/* Sets every sharded gradient of root's units to zero. */
MT_API mt_status mt_zero_grad(mt_module *root);

#ifdef __cplusplus
}
#endif
#endif
