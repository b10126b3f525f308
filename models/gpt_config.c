/* The GPT configuration checks shared by the model and the memory predictor (gpt_config.h). */
#include "models/gpt_config.h"

#include "core/error.h"

#include <stdint.h>

mt_status mt_gpt_config_check(const mt_gpt_config *c, int tp, int sequence_parallel) {
    if (c->layers < 1 || c->d_model < 1 || c->heads < 1 || c->seq < 1 || c->vocab < 1)
        return mt_error(MT_ERR_INVALID_ARG, "gpt: layers %d, d_model %d, heads %d, seq %d, vocab "
                        "%d: each must be >= 1", c->layers, c->d_model, c->heads, c->seq,
                        c->vocab);
    if (tp < 1) return mt_error(MT_ERR_INVALID_ARG, "gpt: tp %d must be >= 1", tp);
    if (c->d_model % c->heads != 0)
        return mt_error(MT_ERR_INVALID_ARG, "gpt: d_model %d not divisible by heads %d",
                        c->d_model, c->heads);
    if (c->heads % tp != 0)
        return mt_error(MT_ERR_INVALID_ARG, "gpt: heads %d not divisible by tp %d", c->heads, tp);
    int local = (c->vocab + tp - 1) / tp;
    if (c->vocab - (tp - 1) * local < 1)
        return mt_error(MT_ERR_INVALID_ARG, "gpt: vocab %d cannot be split over tp %d (padded to "
                        "%d, the last rank's slice of %d rows would hold no real token)",
                        c->vocab, tp, local * tp, local);
    if (sequence_parallel < MT_GPT_SP_OFF || sequence_parallel > MT_GPT_SP_KEEP_GATHERED)
        return mt_error(MT_ERR_INVALID_ARG, "gpt: sequence_parallel %d is no mode (0 off, 1 "
                        "re-gather, 2 keep gathered)", sequence_parallel);
    /* Each tp rank keeps seq / tp positions of every sequence (mt_tp_sequence_check's rule): the
     * batch does not help, the split is within a sequence. */
    if (sequence_parallel != MT_GPT_SP_OFF && c->seq % tp != 0)
        return mt_error(MT_ERR_INVALID_ARG, "gpt: sequence parallelism: seq %d not divisible by "
                        "tp %d", c->seq, tp);
    if ((int64_t)c->layers * c->d_model * c->d_model > INT32_MAX / 16 ||
        (int64_t)c->vocab * c->d_model > INT32_MAX / 2 || (int64_t)c->seq * c->seq > INT32_MAX / 2)
        return mt_error(MT_ERR_INVALID_ARG, "gpt: layers %d, d_model %d, vocab %d, seq %d: too "
                        "large for this implementation's 32-bit sizes", c->layers, c->d_model,
                        c->vocab, c->seq);
    return MT_OK;
}
