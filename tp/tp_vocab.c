/* Vocabulary-parallel embedding and cross-entropy (include/meshtrain/tp.h): each tp rank owns
 * rows [rank * vocab_local, (rank + 1) * vocab_local) of the vocabulary. The embedding is a
 * masked lookup summed over tp; the cross-entropy reduces the row maxima and the sums of
 * exponentials over tp, so the full logits never exist on one rank. */
#include "tp/tp_internal.h"

#include "core/error.h"
#include "core/ops_internal.h"

#include <meshtrain/ops.h>

#include <stdlib.h>

/* The checks of both embedding functions. */
static mt_status check_embedding(const mt_tp_ctx *tp, const char *what, int n, int vocab_local,
                                 int channels) {
    MT_TRY(mt_tp_check_ctx(tp, what));
    if (n < 0 || vocab_local < 1 || channels < 1)
        return mt_error(MT_ERR_INVALID_ARG, "%s: %d ids, vocab slice %d, %d channels", what, n,
                        vocab_local, channels);
    return MT_OK;
}

mt_status mt_tp_vocab_embedding_forward(const mt_tp_ctx *tp, const int *ids, int n,
                                        const float *wte_local, int vocab_local, int channels,
                                        float *out) {
    static const char what[] = "tp vocab-parallel embedding forward";
    MT_TRY(check_embedding(tp, what, n, vocab_local, channels));
    if (n == 0) return MT_OK;
    MT_TRY(mt_op_embedding_forward(tp->dev, ids, (size_t)n, wte_local, tp->rank * vocab_local,
                                   vocab_local, channels, out, false));
    return mt_tp_all_reduce(tp, out, (size_t)n * (size_t)channels, MT_REDUCE_SUM, what);
}

mt_status mt_tp_vocab_embedding_backward(const mt_tp_ctx *tp, const int *ids, int n,
                                         const float *d_out, int vocab_local, int channels,
                                         float *d_wte_local) {
    MT_TRY(check_embedding(tp, "tp vocab-parallel embedding backward", n, vocab_local,
                           channels));
    if (n == 0) return MT_OK;
    return mt_op_embedding_backward(tp->dev, ids, (size_t)n, d_out, tp->rank * vocab_local,
                                    vocab_local, channels, d_wte_local);
}

mt_status mt_tp_vocab_cross_entropy(const mt_tp_ctx *tp, const float *logits_local,
                                    const int *targets, int n, int vocab_local, float scale,
                                    float *loss_sum, float *d_logits_local) {
    double sum = 0.0; /* the _range function checks the context */
    MT_TRY(mt_tp_vocab_cross_entropy_range(tp, logits_local, targets, n, tp->rank * vocab_local,
                                           vocab_local, scale, &sum, d_logits_local));
    if (loss_sum) *loss_sum = (float)sum;
    return MT_OK;
}

mt_status mt_tp_vocab_cross_entropy_range(const mt_tp_ctx *tp, const float *logits_local,
                                          const int *targets, int n, int start, int vocab_local,
                                          float scale, double *loss_sum,
                                          float *d_logits_local) {
    static const char what[] = "tp vocab-parallel cross-entropy";
    MT_TRY(mt_tp_check_ctx(tp, what));
    if (n < 0 || vocab_local < 1 || start < 0 || !loss_sum)
        return mt_error(MT_ERR_INVALID_ARG, "%s: %d rows, vocab slice [%d, +%d), loss_sum %s",
                        what, n, start, vocab_local, loss_sum ? "given" : "NULL");
    *loss_sum = 0.0;
    if (n == 0) return MT_OK;
    size_t rows = (size_t)n;
    /* One scratch block: row_max | sum_exp | target_logit | loss, so that the two sums travel in
     * one all-reduce. */
    float *buf = NULL;
    MT_TRY(mt_tp_scratch(tp, 4 * rows, sizeof(float), (void **)&buf));
    float *row_max = buf, *sum_exp = buf + rows, *target = buf + 2 * rows, *loss = buf + 3 * rows;
    float *host = NULL;
    mt_status st = mt_op_xent_local_max(tp->dev, logits_local, rows, vocab_local, row_max);
    if (st == MT_OK) st = mt_tp_all_reduce(tp, row_max, rows, MT_REDUCE_MAX, what);
    if (st == MT_OK)
        st = mt_op_xent_local_sums(tp->dev, logits_local, targets, rows, start, vocab_local,
                                   row_max, sum_exp, target);
    if (st == MT_OK) st = mt_tp_all_reduce(tp, sum_exp, 2 * rows, MT_REDUCE_SUM, what);
    if (st == MT_OK)
        st = mt_op_xent_loss_backward(tp->dev, logits_local, targets, rows, start, vocab_local,
                                      row_max, sum_exp, target, scale, loss, d_logits_local);
    if (st == MT_OK && !(host = malloc(rows * sizeof *host)))
        st = mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of host memory for %zu losses", what, rows);
    if (st == MT_OK)
        st = mt_device_copy(tp->dev, host, loss, rows * sizeof *host, MT_COPY_DEVICE_TO_HOST,
                            NULL);
    if (st == MT_OK) {
        /* Summed in double: the loss is compared across tp sizes to 1e-5. */
        double sum = 0.0;
        for (size_t i = 0; i < rows; i++) sum += host[i];
        *loss_sum = sum;
    }
    free(host);
    mt_device_free(tp->dev, buf);
    return st;
}
