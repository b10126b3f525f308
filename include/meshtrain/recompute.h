/* Activation recompute (activation checkpointing, per module): the forward of a recomputing
 * module keeps only its output and its input, not what its backward needs (its ops.discard frees
 * that right after the forward); its backward first runs the forward again, then the backward.
 * Memory for compute: a transformer block keeps one tensor of batch x seq x d_model instead of
 * all of its activations, and its forward runs twice per step.
 *
 * Built on the module hooks (mt_module_add_hooks): the model's code only says which modules
 * recompute, and gives them a discard function. Together with FSDP, either order of enabling
 * works: recompute enabled after mt_fsdp_shard (the usual order; FSDP's hooks are outer) re-runs
 * the forward after FSDP's pre-backward gathered the parameters; enabled before, its re-run
 * forward goes through FSDP's forward hooks, which then gather only parameters that were
 * resharded, keep them for the backward and prefetch nothing. Either way a unit is gathered as
 * often as without recompute (once per step when it keeps its parameters after forward, twice
 * when it reshards). docs/architecture.md (module layer) says more.
 *
 * The re-run forward gets the ctx of the backward call: a recomputing module's forward and
 * backward must take the same ctx (the reference models pass one pass object to both). It must
 * compute the same values as the first forward (deterministic kernels), so that the gradients
 * equal those without recompute bit for bit. */
#ifndef MESHTRAIN_RECOMPUTE_H
#define MESHTRAIN_RECOMPUTE_H

#include <meshtrain/api.h>
#include <meshtrain/module.h>
#include <meshtrain/status.h>

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Makes module recompute its activations in backward. MT_ERR_INVALID_ARG, naming the module,
 * when it has no forward of its own (it only runs its children: enable it on those), no
 * ops.discard, already recomputes, or is running. */
MT_API mt_status mt_recompute_enable(mt_module *module);

/* Stops it; MT_ERR_INVALID_ARG when module does not recompute or is running. Not between a
 * forward and its backward: that forward discarded what the backward needs, and nothing would
 * recompute it (enabling there is harmless: the backward re-runs a forward that kept all). */
MT_API mt_status mt_recompute_disable(mt_module *module);

/* Whether module recomputes. */
MT_API bool mt_recompute_enabled(const mt_module *module);

#ifdef __cplusplus
}
#endif
#endif
