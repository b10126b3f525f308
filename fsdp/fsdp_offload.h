/* Internal: the offload data path of an FSDP unit (fsdp/fsdp_offload.c). An offloaded unit keeps
 * its f32 master, its gradient shard (and with bf16 its bf16 shard) in the device's host tier
 * (host_memory.h) and moves shards with the device's stager (stage.h); fsdp_unit.c and
 * fsdp_schedule.c call these at the points where a resident unit would touch its device shards.
 * A unit without an offload policy never calls them except mt_fsdp_offload_setup. */
#ifndef MT_FSDP_FSDP_OFFLOAD_H
#define MT_FSDP_FSDP_OFFLOAD_H

#include "fsdp/fsdp_internal.h"

/* At sharding, before the shards exist: checks the policy and ratio, decides whether this unit
 * is offloaded (the ratio rule of include/meshtrain/fsdp.h) and joins the device's stager. */
mt_status mt_fsdp_offload_setup(mt_fsdp_unit *u, const mt_fsdp_options *o);

/* Allocates an offloaded unit's shards (zeroed) in the host tier, and with OPTIMIZER its device
 * shard, and registers the blocks the stager copies between. */
mt_status mt_fsdp_offload_alloc(mt_fsdp_unit *u);

/* The host shard changed (optimizer step, initialiser, checkpoint load, sharding): the bf16 copy
 * is cast on the host and, with OPTIMIZER, the host-to-device copy into the device shard starts
 * (waited for before the next all-gather reads it). */
mt_status mt_fsdp_offload_refresh(mt_fsdp_unit *u);

/* Waits for the unit's host-to-device parameter copy, if one is in flight: before anything
 * writes its host master or bf16 shard (optimizer step, checkpoint load), which the copy reads.
 * No-op for a unit without offload. */
mt_status mt_fsdp_offload_quiesce(mt_fsdp_unit *u);

/* An initialiser wrote elements [b, e) of the master: their bf16 copy, and the device shard
 * refreshed before the next all-gather. */
mt_status mt_fsdp_offload_written(mt_fsdp_unit *u, size_t b, size_t e);

/* FULL: allocates the device shard and starts its host-to-device copy, unless already started
 * or the unit is not sharded (no-op for other policies). The prefetch calls it for the unit after
 * the one it gathers, so that the copy runs while the current unit computes. */
mt_status mt_fsdp_offload_stage_start(mt_fsdp_unit *u);

/* The device buffer the unit's all-gather sends from, ready: with OPTIMIZER the device shard
 * after its refresh completed; with FULL the device shard staged in (started now unless the
 * prefetch started it), waited for. */
mt_status mt_fsdp_offload_stage_in(mt_fsdp_unit *u, const void **send);

/* The all-gather no longer reads the device shard (done or failed), or a pass ended with a
 * shard staged ahead that no gather used: with FULL it goes, after its staging copy, if never
 * waited for, finished. Returns that copy's failure, or the unregistration's. */
mt_status mt_fsdp_offload_gathered(mt_fsdp_unit *u);

/* The same on an error path that returns st: a failure of the release is logged (what, which
 * unit) instead of replacing st's message; returns st. */
mt_status mt_fsdp_offload_gathered_after(mt_fsdp_unit *u, mt_status st);

/* The reduced gradient shard rs_recv (device, S elements of reduce_dtype, taken over and freed
 * here) starts its copy to the host; it is added into the host gradient shard when the next
 * unit's starts or at mt_fsdp_offload_grads_landed, so the copy overlaps the backward between. */
mt_status mt_fsdp_offload_grad_in(mt_fsdp_unit *u, void *rs_recv);

/* Adds the gradient copy in flight on u's device, if any: the end of a backward, before anything
 * reads the host gradient shards. Lands per device: u need not be offloaded itself (a root
 * without a policy over offloaded layers). No-op when nothing is in flight on u's device. */
mt_status mt_fsdp_offload_grads_landed(mt_fsdp_unit *u);

/* Releases what offload owns: registrations, host blocks (master, shard_lp, grad_shard of an
 * offloaded unit), the device shard and the unit's reference to the device's stager (the last
 * one frees the stager and the landing block of reduced gradients). */
void mt_fsdp_offload_release(mt_fsdp_unit *u);

/* The device's stager the unit copies with (NULL before one is needed); for tests. */
struct mt_stager *mt_fsdp_offload_stager(const mt_fsdp_unit *u);

#endif
