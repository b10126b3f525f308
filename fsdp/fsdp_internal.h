/* Internal: the module and FSDP unit objects shared by module/module.c (the module tree),
 * fsdp/fsdp_unit.c (sharding, unshard/reshard, shard views) and fsdp/fsdp_schedule.c (the hooks
 * around a unit's forward and backward, prefetch, reduce-scatter). */
#ifndef MT_FSDP_FSDP_INTERNAL_H
#define MT_FSDP_FSDP_INTERNAL_H

#include "fsdp/fsdp_shards.h"

#include <meshtrain/comm.h>
#include <meshtrain/device.h>
#include <meshtrain/fsdp.h>
#include <meshtrain/module.h>

#include <stdbool.h>
#include <stddef.h>

typedef struct mt_fsdp_unit mt_fsdp_unit;

struct mt_param {
    char *name;
    mt_module *owner;
    int ndim;
    int64_t global_shape[MT_PARAM_MAX_DIMS];
    int64_t local_shape[MT_PARAM_MAX_DIMS];
    mt_tp_placement tp;
    size_t numel;
    /* Before sharding: its own f32 allocation (params). After: a view into the unit's full
     * buffer while unsharded, NULL while sharded. */
    void *data;
    float *grad;         /* a view into the unit's full gradient during its backward */
    mt_fsdp_unit *unit;  /* the unit that owns it, once sharded */
    size_t offset;       /* its first element in the unit's flat buffer */
};

struct mt_module {
    char *name;
    mt_mesh *mesh;
    mt_device *dev;
    mt_module_ops ops;
    void *user;
    mt_module *parent;
    mt_module **children;
    size_t n_children, cap_children;
    mt_param **params;
    size_t n_params, cap_params;
    mt_fsdp_unit *unit; /* non-NULL once mt_fsdp_shard made this module a unit */
};

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
    long all_gathers;     /* all-gathers issued for this unit */
    long prefetches;      /* of which issued as a prefetch by another unit's hook */
    long reduce_scatters; /* reduce-scatters issued */
    int max_outstanding_rs; /* outermost unit: most reduce-scatters in flight at once */
} mt_fsdp_debug;

struct mt_fsdp_unit {
    mt_module *module;
    mt_device *dev;

    /* Options, resolved. */
    mt_group *shard, *replicate, *tp;
    int tp_rank;
    int reshard_after_forward; /* 1, 0 or -1 (outermost unit: no, others: yes) */
    mt_dtype param_dtype, reduce_dtype;
    char *shard_dim, *replicate_dim;

    int nranks, rank; /* in the shard group */
    mt_param **params;
    size_t n_params;
    size_t total;  /* real elements */
    size_t padded; /* total rounded up to a multiple of nranks */
    size_t S;      /* shard elements: padded / nranks */

    float *master;      /* S f32: params category (f32) or optimizer (bf16) */
    mt_bf16 *shard_lp;  /* S bf16 (params) with param_dtype bf16, else NULL */
    float *grad_shard;  /* S f32 (grads) */
    mt_fsdp_range *ranges;
    size_t n_ranges;

    mt_unshard_state state;
    void *full;        /* padded elements of param_dtype (params) */
    mt_work *ag_work;
    float *full_grad;  /* padded f32 (grads): during backward, and kept while sync is off */
    bool in_backward;

    /* Reduce-scatter in flight. */
    void *rs_send;  /* bf16 staging (comm) or NULL when full_grad itself is sent */
    void *rs_recv;  /* S elements of reduce_dtype (comm) */
    mt_work *rs_work;

    bool requires_sync;
    bool prefetch_enabled;
    mt_fsdp_unit **fwd_prefetch, **bwd_prefetch; /* explicit lists */
    int n_fwd_prefetch, n_bwd_prefetch;
    bool fwd_explicit, bwd_explicit;
    mt_fsdp_unit *fwd_next, *bwd_next; /* from the recorded order */

    /* Used on the outermost unit only: the order of a forward ([0]) and a backward ([1]) pass. */
    mt_fsdp_order order[2];
    mt_fsdp_unit *rs_pending; /* the unit whose reduce-scatter is outstanding */
    int rs_outstanding;
    char *broken; /* set after a collective failed: the message every later call returns */

    mt_fsdp_debug debug;
};

/* The outermost unit above (or at) module: the one whose module has no ancestor unit. NULL when
 * neither module nor any ancestor is a unit. */
mt_fsdp_unit *mt_fsdp_outermost(const mt_module *module);

/* True when some ancestor of module (not module itself) is a unit. */
bool mt_fsdp_has_ancestor_unit(const mt_module *module);

/* Unshard / reshard (fsdp_unit.c). issue starts the all-gather; wait completes it and points the
 * parameters into the full buffer; reshard waits for a gather in flight and frees full. */
mt_status mt_fsdp_unshard_issue(mt_fsdp_unit *u);
mt_status mt_fsdp_unshard_wait(mt_fsdp_unit *u);
mt_status mt_fsdp_reshard(mt_fsdp_unit *u);

/* Every unit at or below module, children before parents (post-order); the array is
 * malloc'd. */
mt_status mt_fsdp_units_below(mt_module *module, mt_fsdp_unit ***units, size_t *n);

/* A short description for messages: "unit 'name' (params a, b, c, ...)" into buf. */
const char *mt_fsdp_unit_desc(const mt_fsdp_unit *u, char *buf, size_t cap);

/* Hooks (fsdp_schedule.c) run by mt_module_forward / mt_module_backward around a unit. */
mt_status mt_fsdp_pre_forward(mt_fsdp_unit *u);
mt_status mt_fsdp_post_forward(mt_fsdp_unit *u, mt_status user_status);
mt_status mt_fsdp_pre_backward(mt_fsdp_unit *u);
mt_status mt_fsdp_post_backward(mt_fsdp_unit *u, mt_status user_status);

/* Finishes the outstanding reduce-scatter of the outermost unit o, if any. */
mt_status mt_fsdp_finish_pending_rs(mt_fsdp_unit *o);

/* Releases a unit: waits for its work and frees its buffers (mt_module_destroy calls it). */
void mt_fsdp_unit_destroy(mt_fsdp_unit *u);

/* Test hook: the counters of module's unit, and the recorded forward/backward order of the
 * outermost unit (units as modules; *n may be 0 before the first step). */
mt_status mt_fsdp_debug_get(mt_module *module, mt_fsdp_debug *out);
mt_status mt_fsdp_debug_order(mt_module *root, bool backward, mt_module **out, size_t cap,
                              size_t *n);

#endif
