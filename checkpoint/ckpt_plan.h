/* Internal: what a rank holds of a model, in the terms of a checkpoint. Built from the live FSDP
 * units by save and load alike: every tensor's name and global shape, and per unit the flat
 * range of this rank's shard and the device buffers behind it (master, and AdamW's m and v). */
#ifndef MT_CHECKPOINT_CKPT_PLAN_H
#define MT_CHECKPOINT_CKPT_PLAN_H

#include "checkpoint/layout.h"
#include "fsdp/fsdp_internal.h"

#include <meshtrain/optim.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

/* What a chunk of a checkpoint holds of a parameter: its value or one of AdamW's moments. The
 * tensor names of the format are these prefixes followed by the parameter's path. */
typedef enum mt_ckpt_kind { MT_CKPT_MODEL = 0, MT_CKPT_EXP_AVG, MT_CKPT_EXP_AVG_SQ, MT_CKPT_KINDS } mt_ckpt_kind;
extern const char *const mt_ckpt_kind_prefix[MT_CKPT_KINDS]; /* "model/", "optim/exp_avg/", ... */

typedef struct mt_ckpt_unit {
    mt_fsdp_unit *unit;
    size_t first, count;          /* its parameters: plan->params[first .. first + count) */
    mt_ckpt_param_layout *layouts; /* count entries, for mt_ckpt_boxes */
    size_t lo, hi;                 /* this rank's shard: [lo, hi) of the flat buffer */
    float *buf[MT_CKPT_KINDS];     /* device: master, m, v (m and v NULL without optimizer) */
    bool host;                     /* buf are host-tier blocks (an offloaded unit, fsdp.h): host
                                      memory on every backend, copied with memcpy */
} mt_ckpt_unit;

typedef struct mt_ckpt_param {
    char *path; /* below the root: "block0.attn.qkv.weight" */
    size_t unit;
    mt_ckpt_param_layout layout; /* offset: in its unit's flat buffer */
    int64_t shape[MT_PARAM_MAX_DIMS]; /* the global shape a checkpoint stores: without padding
                                         rows (mt_param_set_padding) */
} mt_ckpt_param;

typedef struct mt_ckpt_plan {
    mt_device *dev;
    mt_ckpt_unit *units;
    size_t n_units;
    mt_ckpt_param *params;
    size_t n_params;
    bool has_optimizer;
    /* Whether this rank writes: HSDP replicas other than replicate rank 0 hold copies; and
     * tp-replicated parameters are written by tp rank 0 only (mt_ckpt_plan_writes). */
    bool replica_writer;
} mt_ckpt_plan;

/* Builds the plan of root's units (root must be an FSDP unit) and opt's state (may be NULL; else
 * created on root). */
mt_status mt_ckpt_plan_build(mt_module *root, mt_adamw *opt, mt_ckpt_plan *out);
void mt_ckpt_plan_free(mt_ckpt_plan *plan);

/* Whether this rank writes the values of parameter i (see replica_writer). */
bool mt_ckpt_plan_writes(const mt_ckpt_plan *plan, size_t i);

/* Cuts a box of parameter i to its real rows (padding rows are no state). A box from
 * mt_ckpt_boxes stays contiguous in the flat buffer: either dimension 0 has extent 1 or every
 * dimension below it is whole, so what is cut is a suffix. false when nothing remains. */
bool mt_ckpt_clip_box(const mt_ckpt_plan *plan, size_t i, mt_ckpt_box *box);

/* "model/<path>" etc. into buf. */
const char *mt_ckpt_tensor_name(const mt_ckpt_plan *plan, size_t param, mt_ckpt_kind kind,
                                char *buf, size_t cap);

#endif
