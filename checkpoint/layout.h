/* Internal: where the elements of a flat FSDP shard live in global tensor coordinates.
 *
 * A checkpoint describes what each rank saved as boxes of global tensors (offsets and extents
 * per dimension), independent of FSDP's flat buffers and their padding and of the TP split, so
 * that a load can map them onto any other dp x tp layout. A unit's flat buffer is its
 * parameters' tp-local tensors, row-major, one after the other, then padding; a rank's shard is
 * a contiguous range of it. A contiguous range of a row-major tensor is a short run of boxes (at
 * most 2 x ndim - 1): a partial innermost row, then whole rows, then whole planes, ... and back
 * down. A tp-local box moves to global coordinates by the rank's offset along the split
 * dimension. Loading is the same walk on the destination layout, copying from the saved boxes
 * that intersect each destination box.
 */
#ifndef MT_CHECKPOINT_LAYOUT_H
#define MT_CHECKPOINT_LAYOUT_H

#include <meshtrain/module.h>
#include <meshtrain/status.h>

#include <stddef.h>
#include <stdint.h>

/* One parameter's place in a unit's flat buffer. */
typedef struct mt_ckpt_param_layout {
    int ndim;
    int64_t global_shape[MT_PARAM_MAX_DIMS];
    int tp_dim;         /* the dimension split over tp ranks, -1 when replicated */
    int tp_size, tp_rank;
    size_t offset;      /* its first element in the flat buffer */
} mt_ckpt_param_layout;

/* A box of one parameter in global coordinates, and where its elements are in the flat range
 * walked (row-major within the box, contiguous there). */
typedef struct mt_ckpt_box {
    size_t param; /* index into the layouts given to mt_ckpt_boxes */
    int ndim;
    int64_t offset[MT_PARAM_MAX_DIMS];
    int64_t extent[MT_PARAM_MAX_DIMS];
    size_t flat;  /* index of its first element in the flat buffer */
    size_t count; /* elements: the product of the extents */
} mt_ckpt_box;

/* The tp-local shape of a parameter (global / tp along tp_dim). MT_ERR_INVALID_ARG when the
 * global size along tp_dim does not divide. */
mt_status mt_ckpt_local_shape(const mt_ckpt_param_layout *p, int64_t *local);

/* Elements of the tp-local tensor. */
size_t mt_ckpt_local_numel(const mt_ckpt_param_layout *p);

typedef mt_status (*mt_ckpt_box_fn)(const mt_ckpt_box *box, void *arg);

/* Calls fn, in flat order, for every box that the flat range [lo, hi) covers in the n
 * parameters (laid out at their offsets; elements outside every parameter, the padding, are
 * skipped). Stops at fn's first error and returns it. */
mt_status mt_ckpt_boxes(const mt_ckpt_param_layout *params, size_t n, size_t lo, size_t hi,
                        mt_ckpt_box_fn fn, void *arg);

#endif
