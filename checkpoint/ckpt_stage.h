/* Internal: what a rank writes of a checkpoint, staged in host memory exactly as its data file
 * will be (checkpoint/ckpt_stage.c). Filling it is the training stall of an asynchronous save:
 * the device-to-host copy of every box this rank writes, then its extras; the writer thread
 * then only reads it. */
#ifndef MT_CHECKPOINT_CKPT_STAGE_H
#define MT_CHECKPOINT_CKPT_STAGE_H

#include "checkpoint/ckpt_plan.h"

#include <meshtrain/checkpoint.h>
#include <meshtrain/device.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One piece of the data file: a box of a tensor, or an extra. */
typedef struct mt_ckpt_piece {
    char *name; /* tensor name ("model/...") or extra name */
    bool is_extra, per_rank;
    int ndim;
    int64_t offsets[MT_PARAM_MAX_DIMS], extents[MT_PARAM_MAX_DIMS];
    uint64_t offset, bytes; /* in the buffer = in the data file */
} mt_ckpt_piece;

typedef struct mt_ckpt_stage {
    mt_device *dev;
    mt_ckpt_piece *pieces; /* in file order */
    size_t n_pieces, cap_pieces;
    void *buf; /* mt_staging_alloc'd (pinned on a GPU); kept from one save to the next */
    size_t len, cap;
} mt_ckpt_stage;

/* Plans the pieces of this rank (the boxes of its shards it writes: mt_ckpt_plan_writes, padding
 * rows cut off; for each unit its values, then AdamW's m and v when the plan has them; then the
 * extras: per-rank ones on every rank, the others on rank 0) and copies them into buf. */
mt_status mt_ckpt_stage_fill(mt_ckpt_stage *stage, const mt_ckpt_plan *plan, int rank,
                             const mt_checkpoint_extra *extras, int n_extras);

/* Forgets the pieces and keeps the buffer for the next save. */
void mt_ckpt_stage_clear(mt_ckpt_stage *stage);
/* Frees everything. */
void mt_ckpt_stage_free(mt_ckpt_stage *stage);

/* Checks the extras given to save or load: names valid and unique, data given. */
mt_status mt_ckpt_check_extras(const mt_checkpoint_extra *extras, int n);

#endif
