/* Internal helpers shared by the tensor-parallel layers (tp/). */
#ifndef MT_TP_TP_INTERNAL_H
#define MT_TP_TP_INTERNAL_H

#include <meshtrain/comm.h>
#include <meshtrain/tp.h>

#include <stddef.h>

/* MT_ERR_INVALID_ARG naming `what` when tp is not a usable context. */
mt_status mt_tp_check_ctx(const mt_tp_ctx *tp, const char *what);

/* In-place all-reduce of count f32 values over tp (nothing to do at tp size 1). */
mt_status mt_tp_all_reduce(const mt_tp_ctx *tp, float *buf, size_t count, mt_reduce_op op,
                           const char *what);

/* Zeroed device scratch of elems elements (activations category); free with mt_device_free. */
mt_status mt_tp_scratch(const mt_tp_ctx *tp, size_t elems, size_t elem_size, void **out);

/* The context's kept scratch (tp.h, mt_tp_ctx.scratch): one device block, grown (freed, then
 * allocated larger) when a call needs more than it holds. */
struct mt_tp_scratch {
    void *buf;
    size_t bytes;
};

/* elems f32 from the context's kept scratch (grown to at least max(elems, 1) floats), or without
 * one a fresh mt_tp_scratch block; hand it back with mt_tp_scratch_put. All but the first
 * `overwritten` floats are zeroed: those the caller writes whole before reading (an all-gather's
 * destination). */
mt_status mt_tp_scratch_take(const mt_tp_ctx *tp, size_t elems, size_t overwritten,
                             float **out);
/* The overwrite flags of a tp linear's backward (tp.h): any of MT_OVERWRITE_D_IN, _D_W and
 * _D_BIAS, nothing else. With no rows (n == 0) the flagged parameter gradients are set to 0 here,
 * the gradient of nothing (the input gradient then has no rows). */
mt_status mt_tp_backward_overwrite(const mt_tp_ctx *tp, const char *what, unsigned overwrite,
                                   int n, float *d_w, size_t w_elems, float *d_b, size_t b_elems);

/* Frees a block from mt_tp_scratch_take unless it is the kept scratch (which stays). */
void mt_tp_scratch_put(const mt_tp_ctx *tp, float *p);

#endif
