/* Internal: the argument checks the public ops (core/ops.c) run once, before they dispatch to the
 * CPU or the CUDA implementation. Only checks that need no look at the data live here: checks on
 * values in device memory (a non-finite row maximum, say) belong to each backend. */
#ifndef MT_CORE_CPU_OPS_CHECK_H
#define MT_CORE_CPU_OPS_CHECK_H

#include "core/error.h"

#include <stddef.h>
#include <stdint.h>

/* A NULL buffer is only acceptable when it would hold no element. */
static inline mt_status check_ptr(const void *p, size_t elems, const char *op, const char *what) {
    if (!p && elems > 0) return mt_error(MT_ERR_INVALID_ARG, "%s: %s is NULL", op, what);
    return MT_OK;
}

static inline mt_status check_nonneg(const char *op, const char *what, int v) {
    if (v < 0) return mt_error(MT_ERR_INVALID_ARG, "%s: negative %s (%d)", op, what, v);
    return MT_OK;
}

static inline mt_status check_slice(const char *op, int vocab_start, int vocab_local) {
    if (vocab_start < 0 || vocab_local < 0)
        return mt_error(MT_ERR_INVALID_ARG, "%s: bad vocabulary slice (start %d, size %d)", op,
                        vocab_start, vocab_local);
    if ((long long)vocab_start + vocab_local > INT32_MAX)
        return mt_error(MT_ERR_INVALID_ARG, "%s: vocabulary slice [%d, +%d) overflows int", op,
                        vocab_start, vocab_local);
    return MT_OK;
}

static inline mt_status check_linear(const char *op, int batch, int in_features,
                                     int out_features) {
    if (batch < 0 || in_features < 0 || out_features < 0)
        return mt_error(MT_ERR_INVALID_ARG, "%s: negative size (batch %d, in %d, out %d)", op,
                        batch, in_features, out_features);
    return MT_OK;
}

static inline mt_status check_btc(const char *op, int batch, int seq, int channels) {
    if (batch < 0 || seq < 0 || channels < 0)
        return mt_error(MT_ERR_INVALID_ARG, "%s: negative size (B %d, T %d, C %d)", op, batch,
                        seq, channels);
    return MT_OK;
}

static inline mt_status check_attention(const char *op, int batch, int seq, int heads,
                                        int head_dim) {
    if (batch < 0 || seq < 0 || heads < 0 || head_dim < 0)
        return mt_error(MT_ERR_INVALID_ARG,
                        "%s: negative size (B %d, T %d, heads %d, head_dim %d)", op, batch, seq,
                        heads, head_dim);
    if (head_dim == 0 && heads > 0 && batch > 0 && seq > 0)
        return mt_error(MT_ERR_INVALID_ARG, "%s: head_dim 0 (the scale 1/sqrt(0))", op);
    return MT_OK;
}

#endif
