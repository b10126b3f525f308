/* Internal: the FSDP unit objects shared by fsdp/fsdp_unit.c (sharding, unshard/reshard, shard
 * views) and fsdp/fsdp_schedule.c (the hooks around a unit's forward and backward, prefetch,
 * reduce-scatter). A unit is attached to its module as the user data of FSDP's hook
 * registration (module/module_internal.h); the module tree knows nothing of FSDP. */
#ifndef MT_FSDP_FSDP_INTERNAL_H
#define MT_FSDP_FSDP_INTERNAL_H

#include "fsdp/fsdp_shards.h"
#include "module/module_internal.h"

#include <meshtrain/comm.h>
#include <meshtrain/device.h>
#include <meshtrain/fsdp.h>
#include <meshtrain/module.h>
#include <meshtrain/stage.h>

#include <stdbool.h>
#include <stddef.h>

typedef struct mt_fsdp_unit mt_fsdp_unit;
typedef struct mt_fsdp_root mt_fsdp_root;

/* The units in the order their hooks ran in the first pass (recorded: that pass completed). */
typedef struct mt_fsdp_order {
    mt_fsdp_unit **units;
    size_t n, cap;
    bool recorded;
} mt_fsdp_order;

typedef enum mt_unshard_state {
    MT_UNIT_SHARDED = 0, /* only the shard exists */
    MT_UNIT_GATHERING,   /* the all-gather into full is in flight */
    MT_UNIT_UNSHARDED    /* full holds every parameter; params point into it */
} mt_unshard_state;

/* Debug counters of a unit (tests read them through mt_fsdp_debug_get). */
typedef struct mt_fsdp_debug {
    long all_gathers;     /* all-gathers issued for this unit (an unshard into the master shard
                             at one rank, mt_fsdp_gather_aliases, counts as one) */
    long prefetches;      /* of which issued as a prefetch by another unit's hook */
    long reduce_scatters; /* reduce-scatters issued (a gradient added into the shard in place,
                             mt_fsdp_grads_alias, counts as one) */
    int max_outstanding_rs; /* outermost unit: most reduce-scatters in flight at once (its
                               root's; 0 on the other units) */
    long mapped_gathers; /* of all_gathers, those that only waited at a barrier: the unit's
                            gather is mapped (mt_fsdp_options.mapped_gather, u->view) */
    long quiesces; /* offloaded unit: waits for its parameter copy asked from outside its own
                      gather (mt_fsdp_offload_quiesce: optimizer views, landings, loads) */
    long fused_squares; /* reduce-scatters that landed with their sums of squares (grad_sq) */
    /* Seconds the calling thread spent blocked waiting for this unit's all-gathers and
     * reduce-scatters (and HSDP's all-reduce; on the outermost unit, gradient clipping's
     * all-reduces of the squared norm): the communication a step exposes, as mt-bench-gpt-step
     * subtracts it from the step. */
    double wait_s;
} mt_fsdp_debug;

/* What one pass over a model shares: held by the outermost unit, pointed to by every unit of
 * the model (a unit sharded alone holds its own until an enclosing module is sharded). */
struct mt_fsdp_root {
    mt_fsdp_unit *unit; /* the outermost unit */
    int refs;           /* units pointing here */
    /* The order of a forward ([0]) and a backward ([1]) pass. */
    mt_fsdp_order order[2];
    mt_fsdp_unit *rs_pending; /* the unit whose reduce-scatter is outstanding */
    int rs_outstanding;
    int max_outstanding_rs;
    char *broken; /* set after a collective failed: the message every later call returns */
    long pass;    /* forward passes started at the outermost unit */
    /* Called when an offloaded unit's reduced gradient shard has been added into its host
     * gradient (mt_fsdp_set_grad_landed): the overlapped optimizer step starts from here. */
    mt_fsdp_grad_landed_fn grad_landed;
    mt_fsdp_pass_begin_fn pass_begin; /* and before a forward pass reads the shards */
    void *grad_landed_arg;
    /* The shard views of the model's units (mt_fsdp_units_below order of the outermost unit),
     * built at the first landing and kept, so that a landing allocates nothing; freed (NULL)
     * whenever the model's units change (a unit sharded into it or destroyed). */
    mt_fsdp_shard_view *views;
    size_t n_views;
};

struct mt_fsdp_unit {
    mt_module *module;
    mt_device *dev;
    mt_fsdp_root *root;

    /* Options, resolved. */
    mt_group *shard, *replicate, *tp;
    int tp_rank;
    int reshard_after_forward; /* 1, 0 or -1 (outermost unit: no, others: yes) */
    mt_dtype param_dtype, reduce_dtype;
    char *shard_dim, *replicate_dim;

    int nranks, rank; /* in the shard group */
    mt_param **params;
    size_t *offsets; /* each parameter's first element in the flat buffer */
    size_t n_params;
    size_t total;  /* real elements */
    size_t padded; /* total rounded up to a multiple of nranks */
    size_t S;      /* shard elements: padded / nranks */

    /* Offloaded (offload != NONE), master, shard_lp and grad_shard are host-tier blocks. */
    float *master;      /* S f32: params category (f32) or optimizer (bf16) */
    mt_bf16 *shard_lp;  /* S bf16 (params) with param_dtype bf16, else NULL */
    float *grad_shard;  /* S f32 (grads) */

    /* Offload (fsdp_offload.c): this unit's policy (NONE when the ratio left it resident). */
    mt_offload offload;
    struct mt_fsdp_offload_ctx *off; /* the device's shared stager, with any offload policy */
    void *dev_shard;    /* device copy of the shard the all-gather reads (param_dtype): kept
                           with OPTIMIZER, present only while gathering with FULL */
    mt_stage_copy *param_copy; /* host-to-device copy into dev_shard in flight */
    bool dev_stale;     /* OPTIMIZER: the host shard changed and dev_shard was not refreshed */
    mt_fsdp_range *ranges;
    size_t n_ranges;

    mt_unshard_state state;
    void *full;        /* padded elements of param_dtype (params) */
    /* A mapped gather (mt_fsdp_options.mapped_gather): map_wanted when the unit qualified and
     * its shard was padded to whole pages (fsdp_mapped.h); view, the shard group's shards mapped
     * side by side (comm/shm_view.h), when every rank could map them. full is then view while
     * unsharded, and a gather is a barrier. */
    bool map_wanted;
    void *view;
    mt_work *ag_work;
    float *full_grad;  /* padded f32 (grads): during backward, and kept while sync is off */
    /* full_grad is grad_shard itself (mt_fsdp_grads_alias): the backward adds into the shard,
     * nothing is reduced, and the buffer is not FSDP's to free. */
    bool grad_aliased;
    /* grad_shard holds only zeros (allocated or mt_zero_grad, and nothing added since): the
     * backward may then add into it directly and get the bits of 0 + the reduced gradient. */
    bool grad_shard_zero;
    /* grad_shard stands for zeros without holding them: mt_zero_grad on the CPU device marks it
     * instead of writing the whole shard each step (grad_shard_zero is then true). What writes
     * the whole shard (a reduce-scatter into it, an aliased backward whose first writers
     * overwrite) clears it; whatever reads the shard or adds to it first calls
     * mt_fsdp_grad_shard_ready. */
    bool grad_shard_lazy;
    /* The gradient is grad_shard * grad_scale, one rounding per element, not yet written when
     * grad_scale is not 1: a clip's factor on the CPU device (mt_fsdp_scale_grads), applied by
     * the optimizer's step as it reads the shard (mt_fsdp_collect_shards_for_step) instead of a
     * pass of its own. Never other than 1 while grad_shard_zero; whatever else reads the shard
     * or adds to it first calls mt_fsdp_grad_shard_ready, which writes it. */
    float grad_scale;
    /* The sums of squares of grad_shard, one per MT_SQ_CHUNK elements (core/cpu/sum_squares.h),
     * taken by the reduce-scatter that wrote it (comm/coll_squares.h): gradient clipping adds
     * them instead of reading the shard (fsdp/clip.c). grad_sq_valid only from the landing of
     * such a reduce-scatter (finish_rs) until anything else writes the shard or changes what it
     * stands for (grad_shard_ready, scale_grads, zero_grad, the next reduce-scatter);
     * grad_sq_asked: the reduce-scatter in flight takes them. */
    double *grad_sq;
    bool grad_sq_valid, grad_sq_asked;
    bool in_backward;

    /* Reduce-scatter in flight. */
    void *rs_send;  /* bf16 staging (comm) or NULL when full_grad itself is sent */
    void *rs_recv;  /* S elements of reduce_dtype (comm), or grad_shard itself (rs_in_shard) */
    bool rs_in_shard; /* the reduce-scatter writes the gradient shard (mt_fsdp_rs_into_shard) */
    mt_work *rs_work;

    bool requires_sync;
    bool prefetch_enabled;
    mt_fsdp_unit **fwd_prefetch, **bwd_prefetch; /* explicit lists */
    int n_fwd_prefetch, n_bwd_prefetch;
    bool fwd_explicit, bwd_explicit;
    mt_fsdp_unit *fwd_next, *bwd_next; /* from the recorded order */

    /* The root's pass in which this unit last ran its forward / its backward, and whether it was
     * already reported for a forward without a backward (once per unit). */
    long forward_pass, backward_pass;
    bool warned_no_backward;

    size_t view_index; /* this unit's entry in root->views, while they exist */

    mt_fsdp_debug debug;
};

/* The unit of module (FSDP's hook registration on it), or NULL. */
mt_fsdp_unit *mt_fsdp_unit_of(const mt_module *module);

/* True when u is its model's outermost unit. */
bool mt_fsdp_is_outermost(const mt_fsdp_unit *u);

/* The outermost unit above (or at) module: the one whose module has no ancestor unit. NULL when
 * neither module nor any ancestor is a unit. */
mt_fsdp_unit *mt_fsdp_outermost(const mt_module *module);

/* True when some ancestor of module (not module itself) is a unit. */
bool mt_fsdp_has_ancestor_unit(const mt_module *module);

/* True when u's gather is no collective: one rank holds the whole flat buffer as its f32 master
 * shard, so unsharding points the parameters into the master itself (no all-gather, no full
 * buffer). models/gpt_memory.c replays the same rule. */
bool mt_fsdp_gather_aliases(const mt_fsdp_unit *u);

/* True when u's backward may add straight into its gradient shard instead of a zeroed full
 * gradient buffer that a reduce-scatter then adds to it: one rank holds the whole buffer, no
 * replicate group beyond itself, f32 reduction, not offloaded (fsdp_schedule.c), the backward
 * synchronises (without sync the shard stays untouched until the backward that does, whose
 * buffer then already exists) and the shard is all zeros, so that the result has the same bits
 * (0 + g is g). models/gpt_memory.c replays it (assuming the shards zeroed before each step, as
 * train_gpt's mt_zero_grad does). */
bool mt_fsdp_grads_alias(const mt_fsdp_unit *u);

/* True when u's reduce-scatter may write its gradient shard directly instead of a staging
 * buffer that is then added to it: more than one rank (one rank: mt_fsdp_grads_alias), no
 * replicate group beyond itself, f32 reduction, not offloaded, and the shard all zeros (0 + g
 * is g: the same bits). models/gpt_memory.c replays it. */
bool mt_fsdp_rs_into_shard(const mt_fsdp_unit *u);

/* MT_FSDP_FUSED_SQUARES (default 1; 0 turns it off, to compare): whether a reduce-scatter into a
 * CPU gradient shard takes the sums of squares that gradient clipping needs (grad_sq). Read
 * once (fsdp/clip.c). */
bool mt_fsdp_fused_squares(void);

/* Writes the values a gradient shard stands for: the zeros of a lazily zeroed one
 * (grad_shard_lazy), a clip's deferred factor (grad_scale); MT_OK at once when it holds
 * its values. */
mt_status mt_fsdp_grad_shard_ready(mt_fsdp_unit *u);

/* Unshard / reshard (fsdp_unit.c). issue starts the all-gather; wait completes it and points the
 * parameters into the full buffer; reshard waits for a gather in flight and frees full. */
mt_status mt_fsdp_unshard_issue(mt_fsdp_unit *u);
mt_status mt_fsdp_unshard_wait(mt_fsdp_unit *u);
mt_status mt_fsdp_reshard(mt_fsdp_unit *u);

/* Every unit at or below module, children before parents (post-order); the array is
 * malloc'd. */
mt_status mt_fsdp_units_below(mt_module *module, mt_fsdp_unit ***units, size_t *n);

/* Compares the unit's parameter list (names, global shapes, placements) within its shard,
 * replicate and tp groups (collectives on host memory); MT_ERR_MISMATCH names the ranks that
 * differ and the first differing parameter (fsdp_agree.c). Called by mt_fsdp_shard. */
mt_status mt_fsdp_check_ranks_agree(mt_fsdp_unit *u);

/* A short description for messages: "unit 'name' (params a, b, c, ...)" into buf. */
const char *mt_fsdp_unit_desc(const mt_fsdp_unit *u, char *buf, size_t cap);

/* FSDP's hooks (fsdp_schedule.c), registered on a unit's module by mt_fsdp_shard with the unit
 * as user data; release is mt_fsdp_unit_destroy. */
extern const mt_module_hooks mt_fsdp_hooks;

/* Releases a unit: waits for its work and frees its buffers (mt_module_destroy calls it through
 * the hook registration's release). */
void mt_fsdp_unit_destroy(mt_module *module, void *unit);

/* The view of u among its model's units (built once per layout into u->root->views): *view
 * stays valid until the model's units change; *index is u's position among the *count units. */
mt_status mt_fsdp_unit_view(mt_fsdp_unit *u, const mt_fsdp_shard_view **view, size_t *index,
                            size_t *count);

/* Where param (the i-th of u) starts in u's flat buffer. */
size_t mt_fsdp_param_offset(const mt_fsdp_unit *u, size_t i);

/* Test hook: the counters of module's unit, and the recorded forward/backward order of the
 * outermost unit (units as modules; *n may be 0 before the first step). */
mt_status mt_fsdp_debug_get(mt_module *module, mt_fsdp_debug *out);
mt_status mt_fsdp_debug_order(mt_module *root, bool backward, mt_module **out, size_t cap,
                              size_t *n);

#endif
