/* Tensor-parallel linears (include/meshtrain/tp.h): the tp context of a mesh, column-parallel
 * and row-parallel linear layers. The only communication is one all-reduce over tp: of the
 * input gradient after a column-parallel backward, of the output after a row-parallel forward. */
#include "tp/tp_internal.h"

#include "core/error.h"

#include <meshtrain/module.h>
#include <meshtrain/ops.h>

#include <stdlib.h>

mt_status mt_tp_context(mt_mesh *mesh, mt_tp_ctx *out) {
    return mt_tp_context_dim(mesh, MT_TP_DIM_DEFAULT, out);
}

mt_status mt_tp_context_dim(mt_mesh *mesh, const char *dim, mt_tp_ctx *out) {
    if (!mesh || !dim || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_tp_context: mesh, dim and out required");
    out->dev = mt_runtime_device(mt_mesh_runtime(mesh));
    out->group = NULL;
    out->size = 1;
    out->rank = 0;
    out->scratch = NULL;
    /* The model passes the dimension its modules place their parameters on
     * (mt_module_tp_dim), so that layers and parameters split alike. */
    int d = mt_mesh_dim_index(mesh, dim);
    if (d >= 0) {
        MT_TRY(mt_mesh_group(mesh, dim, &out->group));
        out->size = mt_mesh_dim_size(mesh, d);
        out->rank = mt_mesh_coord(mesh, d);
    }
    out->scratch = calloc(1, sizeof *out->scratch);
    if (!out->scratch)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "mt_tp_context: out of host memory");
    return MT_OK;
}

void mt_tp_context_release(mt_tp_ctx *tp) {
    if (!tp || !tp->scratch) return;
    mt_device_free(tp->dev, tp->scratch->buf);
    free(tp->scratch);
    tp->scratch = NULL;
}

size_t mt_tp_context_scratch_bytes(const mt_tp_ctx *tp) {
    return tp && tp->scratch ? tp->scratch->bytes : 0;
}

mt_status mt_tp_check_ctx(const mt_tp_ctx *tp, const char *what) {
    if (!tp || !tp->dev)
        return mt_error(MT_ERR_INVALID_ARG, "%s: no tp context (call mt_tp_context first)", what);
    if (tp->size < 1 || tp->rank < 0 || tp->rank >= tp->size || (tp->size > 1 && !tp->group))
        return mt_error(MT_ERR_INVALID_ARG, "%s: inconsistent tp context (rank %d of %d, %s)",
                        what, tp->rank, tp->size, tp->group ? "with a group" : "no group");
    return MT_OK;
}

mt_status mt_tp_all_reduce(const mt_tp_ctx *tp, float *buf, size_t count, mt_reduce_op op,
                           const char *what) {
    if (tp->size == 1 || count == 0) return MT_OK;
    mt_status st = mt_all_reduce(tp->group, buf, buf, count, MT_F32, op, NULL);
    if (st != MT_OK)
        return mt_error_wrap(st, "%s: all-reduce of %zu values over tp (rank %d of %d)", what,
                             count, tp->rank, tp->size);
    return MT_OK;
}

mt_status mt_tp_scratch(const mt_tp_ctx *tp, size_t elems, size_t elem_size, void **out) {
    size_t bytes = (elems ? elems : 1) * elem_size;
    MT_TRY(mt_device_alloc(tp->dev, bytes, MT_MEM_ACTIVATIONS, out));
    mt_status st = mt_device_memset(tp->dev, *out, 0, bytes, NULL);
    if (st != MT_OK) {
        mt_device_free(tp->dev, *out);
        *out = NULL;
    }
    return st;
}

mt_status mt_tp_scratch_take(const mt_tp_ctx *tp, size_t elems, size_t overwritten,
                             float **out) {
    struct mt_tp_scratch *s = tp->scratch;
    if (!s) return mt_tp_scratch(tp, elems, sizeof(float), (void **)out);
    if (overwritten > elems) overwritten = elems;
    size_t bytes = (elems ? elems : 1) * sizeof(float);
    if (s->bytes < bytes) {
        /* Nothing in it outlives a call: the old block goes before the larger one comes. */
        mt_device_free(tp->dev, s->buf);
        s->buf = NULL;
        s->bytes = 0;
        MT_TRY(mt_device_alloc(tp->dev, bytes, MT_MEM_ACTIVATIONS, &s->buf));
        s->bytes = bytes;
    }
    /* The caller's first `overwritten` floats (an all-gather's destination) are written whole
     * before they are read: zeroing them too would be a second pass over n x features. */
    size_t skip = overwritten * sizeof(float);
    if (bytes > skip)
        MT_TRY(mt_device_memset(tp->dev, (char *)s->buf + skip, 0, bytes - skip, NULL));
    *out = s->buf;
    return MT_OK;
}

void mt_tp_scratch_put(const mt_tp_ctx *tp, float *p) {
    if (!tp->scratch || (void *)p != tp->scratch->buf) mt_device_free(tp->dev, p);
}

static mt_status check_sizes(const char *what, int n, int in, int out) {
    if (n < 0 || in < 1 || out < 1)
        return mt_error(MT_ERR_INVALID_ARG, "%s: %d rows, %d input and %d output features "
                        "(rows >= 0, features >= 1)", what, n, in, out);
    return MT_OK;
}

mt_status mt_tp_backward_overwrite(const mt_tp_ctx *tp, const char *what, unsigned overwrite,
                                   int n, float *d_w, size_t w_elems, float *d_b, size_t b_elems) {
    if (overwrite & ~(MT_OVERWRITE_D_IN | MT_OVERWRITE_D_W | MT_OVERWRITE_D_BIAS))
        return mt_error(MT_ERR_INVALID_ARG, "%s: overwrite flags 0x%x: only MT_OVERWRITE_D_IN, "
                        "MT_OVERWRITE_D_W and MT_OVERWRITE_D_BIAS (ops.h)", what, overwrite);
    if (n != 0) return MT_OK;
    if ((overwrite & MT_OVERWRITE_D_W) && d_w)
        MT_TRY(mt_device_memset(tp->dev, d_w, 0, w_elems * sizeof(float), NULL));
    if ((overwrite & MT_OVERWRITE_D_BIAS) && d_b)
        MT_TRY(mt_device_memset(tp->dev, d_b, 0, b_elems * sizeof(float), NULL));
    return MT_OK;
}

mt_status mt_tp_column_linear_forward(const mt_tp_ctx *tp, const float *in, const void *w_local,
                                      mt_dtype w_dtype, const float *b_local, float *out_local,
                                      int n, int in_features, int out_features_local) {
    static const char what[] = "tp column-parallel linear forward";
    MT_TRY(mt_tp_check_ctx(tp, what));
    MT_TRY(check_sizes(what, n, in_features, out_features_local));
    if (n == 0) return MT_OK;
    return mt_op_linear_forward_ex(tp->dev, in, w_local, w_dtype, b_local, out_local, n,
                                   in_features, out_features_local);
}

mt_status mt_tp_column_linear_backward(const mt_tp_ctx *tp, const float *d_out_local,
                                       const float *in, const void *w_local, mt_dtype w_dtype,
                                       float *d_in, float *d_w, float *d_b, int n,
                                       int in_features, int out_features_local,
                                       unsigned overwrite) {
    static const char what[] = "tp column-parallel linear backward";
    MT_TRY(mt_tp_check_ctx(tp, what));
    MT_TRY(check_sizes(what, n, in_features, out_features_local));
    size_t w_elems = (size_t)out_features_local * (size_t)in_features;
    MT_TRY(mt_tp_backward_overwrite(tp, what, overwrite, n, d_w, w_elems, d_b,
                                    (size_t)out_features_local));
    if (n == 0) return MT_OK;
    if (!d_in || tp->size == 1)
        return mt_op_linear_backward_into(tp->dev, d_out_local, in, w_local, w_dtype, d_in, d_w,
                                          d_b, n, in_features, out_features_local, overwrite);
    /* Each rank holds only its output features' part of the input gradient: summed over tp in
     * d_in itself when d_in is overwritten, else in a scratch buffer, then accumulated, so that
     * d_in keeps its += meaning. */
    size_t count = (size_t)n * (size_t)in_features;
    if (overwrite & MT_OVERWRITE_D_IN) {
        MT_TRY(mt_op_linear_backward_into(tp->dev, d_out_local, in, w_local, w_dtype, d_in, d_w,
                                          d_b, n, in_features, out_features_local, overwrite));
        return mt_tp_all_reduce(tp, d_in, count, MT_REDUCE_SUM, what);
    }
    float *part = NULL;
    MT_TRY(mt_tp_scratch(tp, count, sizeof(float), (void **)&part));
    mt_status st = mt_op_linear_backward_into(tp->dev, d_out_local, in, w_local, w_dtype, part,
                                              d_w, d_b, n, in_features, out_features_local,
                                              overwrite);
    if (st == MT_OK) st = mt_tp_all_reduce(tp, part, count, MT_REDUCE_SUM, what);
    if (st == MT_OK) st = mt_op_add(tp->dev, d_in, part, d_in, count);
    mt_device_free(tp->dev, part);
    return st;
}

mt_status mt_tp_row_linear_forward(const mt_tp_ctx *tp, const float *in_local,
                                   const void *w_local, mt_dtype w_dtype, const float *b,
                                   float *out, int n, int in_features_local, int out_features) {
    static const char what[] = "tp row-parallel linear forward";
    MT_TRY(mt_tp_check_ctx(tp, what));
    MT_TRY(check_sizes(what, n, in_features_local, out_features));
    if (n == 0) return MT_OK;
    /* The bias joins the partial sum of tp rank 0 only, so the all-reduce adds it exactly once. */
    const float *bias = tp->rank == 0 ? b : NULL;
    MT_TRY(mt_op_linear_forward_ex(tp->dev, in_local, w_local, w_dtype, bias, out, n,
                                   in_features_local, out_features));
    return mt_tp_all_reduce(tp, out, (size_t)n * (size_t)out_features, MT_REDUCE_SUM, what);
}

mt_status mt_tp_row_linear_backward(const mt_tp_ctx *tp, const float *d_out,
                                    const float *in_local, const void *w_local,
                                    mt_dtype w_dtype, float *d_in_local, float *d_w, float *d_b,
                                    int n, int in_features_local, int out_features,
                                    unsigned overwrite) {
    static const char what[] = "tp row-parallel linear backward";
    MT_TRY(mt_tp_check_ctx(tp, what));
    MT_TRY(check_sizes(what, n, in_features_local, out_features));
    MT_TRY(mt_tp_backward_overwrite(tp, what, overwrite, n, d_w,
                                    (size_t)out_features * (size_t)in_features_local, d_b,
                                    (size_t)out_features));
    if (n == 0) return MT_OK;
    /* d_out is replicated, so every rank's bias gradient is the full one, as the replicated
     * parameter needs. */
    return mt_op_linear_backward_into(tp->dev, d_out, in_local, w_local, w_dtype, d_in_local, d_w,
                                      d_b, n, in_features_local, out_features, overwrite);
}
