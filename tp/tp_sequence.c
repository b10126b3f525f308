/* Sequence parallelism (Megatron-style; include/meshtrain/tp.h): outside the tensor-parallel
 * regions the activations are split over tp along the flattened token rows, rank r holding rows
 * [r * n / tp, (r + 1) * n / tp) of the n x C activation. Entering a column-parallel linear
 * all-gathers those rows; leaving a row-parallel linear reduce-scatters them. That is the same
 * traffic as the all-reduce it replaces (an all-reduce is a reduce-scatter plus an all-gather),
 * split at the other end of the region. In backward the roles swap: the row-parallel linear
 * all-gathers its output gradient, the column-parallel linear reduce-scatters its input
 * gradient. The column-parallel input is either gathered again in backward (Megatron's choice,
 * mt_tp_column_linear_*_sp: the kept activation stays n / tp rows, at the price of one more
 * all-gather per column-parallel linear per backward) or kept gathered by the caller from the
 * forward (mt_tp_column_linear_*_sp_gathered: no re-gather, n rows kept per linear).
 *
 * Scratch (the gathered operand, a partial sum, an input gradient's part) comes from the
 * context's kept block (mt_tp_scratch_take): one call needs it at a time, so one block, as large
 * as the largest call's (a column backward that re-gathers takes its gathered input and its
 * part at once), serves every layer of a step. models/gpt_memory.c predicts it. */
#include "tp/tp_internal.h"

#include "core/error.h"

#include <meshtrain/ops.h>

/* Checks of the row movers: a usable context, sizes, and rows that split over tp. */
static mt_status check_rows(const mt_tp_ctx *tp, const char *what, int n, int channels) {
    MT_TRY(mt_tp_check_ctx(tp, what));
    if (n < 0 || channels < 1)
        return mt_error(MT_ERR_INVALID_ARG, "%s: %d rows of %d channels (rows >= 0, channels "
                        ">= 1)", what, n, channels);
    if (n % tp->size != 0)
        return mt_error(MT_ERR_INVALID_ARG, "%s: %d rows not divisible by tp %d (sequence "
                        "parallelism splits the rows evenly)", what, n, tp->size);
    return MT_OK;
}

/* The same for a layer with in and out features. */
static mt_status check_sp(const mt_tp_ctx *tp, const char *what, int n, int in, int out) {
    MT_TRY(check_rows(tp, what, n, in));
    if (out < 1)
        return mt_error(MT_ERR_INVALID_ARG, "%s: %d output features (>= 1)", what, out);
    return MT_OK;
}

mt_status mt_tp_sequence_check(const mt_tp_ctx *tp, int seq) {
    MT_TRY(mt_tp_check_ctx(tp, "sequence parallelism"));
    if (seq < 1 || seq % tp->size != 0)
        return mt_error(MT_ERR_INVALID_ARG, "sequence parallelism: seq %d not divisible by tp %d",
                        seq, tp->size);
    return MT_OK;
}

mt_status mt_tp_sequence_gather(const mt_tp_ctx *tp, const float *in_shard, float *out, int n,
                                int channels) {
    static const char what[] = "tp sequence all-gather";
    MT_TRY(check_rows(tp, what, n, channels));
    size_t shard = (size_t)(n / tp->size) * (size_t)channels;
    if (shard == 0) return MT_OK;
    if (tp->size == 1)
        return mt_device_copy(tp->dev, out, in_shard, shard * sizeof(float),
                              MT_COPY_DEVICE_TO_DEVICE, NULL);
    mt_status st = mt_all_gather(tp->group, in_shard, out, shard, MT_F32, NULL);
    if (st != MT_OK)
        return mt_error_wrap(st, "%s: %d rows of %d channels over tp (rank %d of %d)", what, n,
                             channels, tp->rank, tp->size);
    return MT_OK;
}

mt_status mt_tp_sequence_reduce_scatter(const mt_tp_ctx *tp, const float *in, float *out_shard,
                                        int n, int channels) {
    static const char what[] = "tp sequence reduce-scatter";
    MT_TRY(check_rows(tp, what, n, channels));
    size_t shard = (size_t)(n / tp->size) * (size_t)channels;
    if (shard == 0) return MT_OK;
    if (tp->size == 1)
        return mt_device_copy(tp->dev, out_shard, in, shard * sizeof(float),
                              MT_COPY_DEVICE_TO_DEVICE, NULL);
    mt_status st = mt_reduce_scatter(tp->group, in, out_shard, shard, MT_F32, MT_REDUCE_SUM, NULL);
    if (st != MT_OK)
        return mt_error_wrap(st, "%s: %d rows of %d channels over tp (rank %d of %d)", what, n,
                             channels, tp->rank, tp->size);
    return MT_OK;
}

/* *full = the gathered n x channels rows of in_shard, at the start of extra + n x channels
 * floats of scratch (the caller's use of the rest; give it back with mt_tp_scratch_put). */
static mt_status gather_scratch(const mt_tp_ctx *tp, const float *in_shard, int n, int channels,
                                size_t extra, float **full) {
    MT_TRY(mt_tp_scratch_take(tp, (size_t)n * (size_t)channels + extra,
                               (size_t)n * (size_t)channels, full));
    mt_status st = mt_tp_sequence_gather(tp, in_shard, *full, n, channels);
    if (st != MT_OK) {
        mt_tp_scratch_put(tp, *full);
        *full = NULL;
    }
    return st;
}

mt_status mt_tp_column_linear_forward_sp(const mt_tp_ctx *tp, const float *in_shard,
                                         const void *w_local, mt_dtype w_dtype,
                                         const float *b_local, float *out_local, int n,
                                         int in_features, int out_features_local) {
    static const char what[] = "tp column-parallel linear forward (sequence-parallel input)";
    MT_TRY(check_sp(tp, what, n, in_features, out_features_local));
    if (n == 0) return MT_OK;
    float *full = NULL;
    MT_TRY(gather_scratch(tp, in_shard, n, in_features, 0, &full));
    mt_status st = mt_op_linear_forward_ex(tp->dev, full, w_local, w_dtype, b_local, out_local,
                                           n, in_features, out_features_local);
    mt_tp_scratch_put(tp, full);
    return st;
}

mt_status mt_tp_column_linear_forward_sp_gathered(const mt_tp_ctx *tp, const float *in_shard,
                                                  float *in_full, const void *w_local,
                                                  mt_dtype w_dtype, const float *b_local,
                                                  float *out_local, int n, int in_features,
                                                  int out_features_local) {
    static const char what[] = "tp column-parallel linear forward (sequence-parallel input, "
                               "kept gathered)";
    MT_TRY(check_sp(tp, what, n, in_features, out_features_local));
    if (n == 0) return MT_OK;
    if (!in_shard || !in_full)
        return mt_error(MT_ERR_INVALID_ARG, "%s: in_shard and in_full must not be NULL", what);
    MT_TRY(mt_tp_sequence_gather(tp, in_shard, in_full, n, in_features));
    return mt_op_linear_forward_ex(tp->dev, in_full, w_local, w_dtype, b_local, out_local, n,
                                   in_features, out_features_local);
}

/* The floats of scratch column_backward_full's part needs: the input gradient's n x in_features
 * and, unless the sum is reduce-scattered straight into an overwritten d_in_shard, this rank's
 * rows of it (none without an input gradient). */
static size_t part_elems(const mt_tp_ctx *tp, const float *d_in_shard, int n, int in_features,
                         unsigned overwrite) {
    size_t count = (size_t)n * (size_t)in_features;
    if (!d_in_shard) return 0;
    return count + (overwrite & MT_OVERWRITE_D_IN ? 0 : count / (size_t)tp->size);
}

/* The column-parallel backward from the gathered input full (n x in_features), however it was
 * obtained: d_w, d_b from it, the input gradient reduce-scattered into d_in_shard. part: zeroed
 * scratch of part_elems floats (NULL without d_in_shard). */
static mt_status column_backward_full(const mt_tp_ctx *tp, const float *d_out_local,
                                      const float *full, const void *w_local, mt_dtype w_dtype,
                                      float *d_in_shard, float *d_w, float *d_b, int n,
                                      int in_features, int out_features_local, float *part,
                                      unsigned overwrite) {
    size_t count = (size_t)n * (size_t)in_features, shard = count / (size_t)tp->size;
    mt_status st = mt_op_linear_backward_into(tp->dev, d_out_local, full, w_local, w_dtype,
                                              d_in_shard ? part : NULL, d_w, d_b, n, in_features,
                                              out_features_local, overwrite);
    /* Each rank holds its output features' part of every row's input gradient: summed over tp,
     * each rank keeps its rows, then accumulates, so that d_in_shard keeps its += meaning; an
     * overwritten d_in_shard takes its rows of the sum directly. */
    if (st == MT_OK && d_in_shard) {
        bool into = (overwrite & MT_OVERWRITE_D_IN) != 0;
        float *mine = into ? d_in_shard : part + count;
        st = mt_tp_sequence_reduce_scatter(tp, part, mine, n, in_features);
        if (st == MT_OK && !into) st = mt_op_add(tp->dev, d_in_shard, mine, d_in_shard, shard);
    }
    return st;
}

mt_status mt_tp_column_linear_backward_sp(const mt_tp_ctx *tp, const float *d_out_local,
                                          const float *in_shard, const void *w_local,
                                          mt_dtype w_dtype, float *d_in_shard, float *d_w,
                                          float *d_b, int n, int in_features,
                                          int out_features_local, unsigned overwrite) {
    static const char what[] = "tp column-parallel linear backward (sequence-parallel input)";
    MT_TRY(check_sp(tp, what, n, in_features, out_features_local));
    MT_TRY(mt_tp_backward_overwrite(tp, what, overwrite, n, d_w,
                                    (size_t)out_features_local * (size_t)in_features, d_b,
                                    (size_t)out_features_local));
    if (n == 0) return MT_OK;
    float *full = NULL;
    /* The input was not kept gathered: gather it again for the weight gradient, the part
     * behind it in the same scratch. */
    size_t count = (size_t)n * (size_t)in_features;
    MT_TRY(gather_scratch(tp, in_shard, n, in_features,
                          part_elems(tp, d_in_shard, n, in_features, overwrite), &full));
    mt_status st = column_backward_full(tp, d_out_local, full, w_local, w_dtype, d_in_shard, d_w,
                                        d_b, n, in_features, out_features_local, full + count,
                                        overwrite);
    mt_tp_scratch_put(tp, full);
    return st;
}

mt_status mt_tp_column_linear_backward_sp_gathered(const mt_tp_ctx *tp,
                                                   const float *d_out_local,
                                                   const float *in_full, const void *w_local,
                                                   mt_dtype w_dtype, float *d_in_shard,
                                                   float *d_w, float *d_b, int n,
                                                   int in_features, int out_features_local,
                                                   unsigned overwrite) {
    static const char what[] = "tp column-parallel linear backward (sequence-parallel input, "
                               "kept gathered)";
    MT_TRY(check_sp(tp, what, n, in_features, out_features_local));
    MT_TRY(mt_tp_backward_overwrite(tp, what, overwrite, n, d_w,
                                    (size_t)out_features_local * (size_t)in_features, d_b,
                                    (size_t)out_features_local));
    if (n == 0) return MT_OK;
    if (!in_full)
        return mt_error(MT_ERR_INVALID_ARG, "%s: in_full (the input gathered in forward) must "
                        "not be NULL", what);
    size_t elems = part_elems(tp, d_in_shard, n, in_features, overwrite);
    float *part = NULL;
    if (elems) MT_TRY(mt_tp_scratch_take(tp, elems, 0, &part));
    mt_status st = column_backward_full(tp, d_out_local, in_full, w_local, w_dtype, d_in_shard,
                                        d_w, d_b, n, in_features, out_features_local, part,
                                        overwrite);
    if (part) mt_tp_scratch_put(tp, part);
    return st;
}

mt_status mt_tp_row_linear_forward_sp(const mt_tp_ctx *tp, const float *in_local,
                                      const void *w_local, mt_dtype w_dtype, const float *b,
                                      float *out_shard, int n, int in_features_local,
                                      int out_features) {
    static const char what[] = "tp row-parallel linear forward (sequence-parallel output)";
    MT_TRY(check_sp(tp, what, n, in_features_local, out_features));
    if (n == 0) return MT_OK;
    float *partial = NULL;
    MT_TRY(mt_tp_scratch_take(tp, (size_t)n * (size_t)out_features, 0, &partial));
    /* The bias joins the partial sum of tp rank 0 only, so the reduce-scatter adds it once. */
    const float *bias = tp->rank == 0 ? b : NULL;
    mt_status st = mt_op_linear_forward_ex(tp->dev, in_local, w_local, w_dtype, bias, partial, n,
                                           in_features_local, out_features);
    if (st == MT_OK) st = mt_tp_sequence_reduce_scatter(tp, partial, out_shard, n, out_features);
    mt_tp_scratch_put(tp, partial);
    return st;
}

mt_status mt_tp_row_linear_backward_sp(const mt_tp_ctx *tp, const float *d_out_shard,
                                       const float *in_local, const void *w_local,
                                       mt_dtype w_dtype, float *d_in_local, float *d_w,
                                       float *d_b, int n, int in_features_local,
                                       int out_features, unsigned overwrite) {
    static const char what[] = "tp row-parallel linear backward (sequence-parallel output)";
    MT_TRY(check_sp(tp, what, n, in_features_local, out_features));
    MT_TRY(mt_tp_backward_overwrite(tp, what, overwrite, n, d_w,
                                    (size_t)out_features * (size_t)in_features_local, d_b,
                                    (size_t)out_features));
    if (n == 0) return MT_OK;
    float *d_out = NULL;
    MT_TRY(gather_scratch(tp, d_out_shard, n, out_features, 0, &d_out));
    /* From the gathered gradient every rank computes the full bias gradient, the same on each,
     * as the replicated parameter needs: no all-reduce of it. */
    mt_status st = mt_op_linear_backward_into(tp->dev, d_out, in_local, w_local, w_dtype,
                                              d_in_local, d_w, d_b, n, in_features_local,
                                              out_features, overwrite);
    mt_tp_scratch_put(tp, d_out);
    return st;
}

mt_status mt_tp_vocab_embedding_forward_sp(const mt_tp_ctx *tp, const int *ids, int n,
                                           const float *wte_local, int vocab_local, int channels,
                                           float *out_shard) {
    static const char what[] = "tp vocab-parallel embedding forward (sequence-parallel output)";
    MT_TRY(check_sp(tp, what, n, vocab_local, channels));
    if (n == 0) return MT_OK;
    float *partial = NULL;
    MT_TRY(mt_tp_scratch_take(tp, (size_t)n * (size_t)channels, 0, &partial));
    /* Each rank looks up the ids of its vocabulary slice (the others' rows stay 0). */
    mt_status st = mt_op_embedding_forward(tp->dev, ids, (size_t)n, wte_local,
                                           tp->rank * vocab_local, vocab_local, channels, partial,
                                           false);
    if (st == MT_OK) st = mt_tp_sequence_reduce_scatter(tp, partial, out_shard, n, channels);
    mt_tp_scratch_put(tp, partial);
    return st;
}

mt_status mt_tp_sequence_position_forward(const mt_tp_ctx *tp, const float *wpe, int n, int seq,
                                          int channels, float *out_shard) {
    static const char what[] = "tp sequence position embedding";
    MT_TRY(check_rows(tp, what, n, channels));
    MT_TRY(mt_tp_sequence_check(tp, seq));
    if (n % seq != 0)
        return mt_error(MT_ERR_INVALID_ARG, "%s: %d rows are no whole number of sequences of %d",
                        what, n, seq);
    /* The shard starts inside a sequence when tp does not divide the batch: add wpe in runs of
     * consecutive positions, a run ending where a sequence does. */
    int rows = n / tp->size, first = tp->rank * rows;
    for (int i = 0; i < rows;) {
        int pos = (first + i) % seq, run = seq - pos;
        if (run > rows - i) run = rows - i;
        float *o = out_shard + (size_t)i * (size_t)channels;
        MT_TRY(mt_op_add(tp->dev, o, wpe + (size_t)pos * (size_t)channels, o,
                         (size_t)run * (size_t)channels));
        i += run;
    }
    return MT_OK;
}

mt_status mt_tp_sequence_grad_sum(const mt_tp_ctx *tp, float *part, size_t count) {
    static const char what[] = "tp sequence-parallel parameter gradient sum";
    MT_TRY(mt_tp_check_ctx(tp, what));
    return mt_tp_all_reduce(tp, part, count, MT_REDUCE_SUM, what);
}
