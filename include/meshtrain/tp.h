/* Tensor-parallel layers over the mesh's "tp" dimension (Megatron-style), as functions on device
 * buffers that a model's module calls from its forward/backward. The parameters are the tp-local
 * parts of module parameters created with their placements (module.h), so FSDP shards the local
 * slice over dp and nothing is told twice:
 *   column-parallel linear: W [out x in] Shard(0), b [out] Shard(0); input replicated, output
 *     sharded (out / tp features per rank); backward all-reduces the input gradient over tp.
 *   row-parallel linear:    W [out x in] Shard(1), b [out] Replicate; input sharded, output
 *     all-reduced over tp, bias added once; backward needs no communication.
 *   vocab-parallel embedding: wte [V x C] Shard(0); masked lookup, then all-reduce.
 *   vocab-parallel cross-entropy: logits sharded on the vocabulary; max and sum-exp reduced over
 *     tp, the full logits never gathered.
 * Sequence parallelism (the _sp functions, mt_tp_sequence_*): the activations outside those
 * layers (LayerNorms, residual adds, the embedding output) are split over tp by rows instead of
 * replicated; the column-parallel linear all-gathers its input and reduce-scatters its input
 * gradient, the row-parallel linear reduce-scatters its output and all-gathers its output
 * gradient (docs/architecture.md, "Sequence parallelism").
 * Without a "tp" dimension (or with tp = 1) every function is its plain single-rank version. */
#ifndef MESHTRAIN_TP_H
#define MESHTRAIN_TP_H

#include <meshtrain/api.h>
#include <meshtrain/comm.h>
#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/mesh.h>
#include <meshtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_tp_ctx {
    mt_device *dev;
    mt_group *group; /* the tp group; NULL when the mesh has no "tp" dimension */
    int size;        /* tp size (1 without a tp dimension) */
    int rank;        /* this rank's tp coordinate */
    /* The sequence-parallel functions' device scratch (activations category), kept between
     * calls and grown when one needs more, so that a step does not allocate and free it per
     * call; made by mt_tp_context, freed by mt_tp_context_release. NULL (a context filled in
     * by hand): each call allocates and frees its own. Copies of a context share it, so a
     * context and all its copies must not be used from two threads at once (one call at a
     * time uses the scratch). */
    struct mt_tp_scratch *scratch;
} mt_tp_ctx;

/* The tp context of a mesh: its MT_TP_DIM_DEFAULT ("tp") dimension's group, or size 1 when the
 * mesh has no such dimension. Every context these make must be released with
 * mt_tp_context_release (since 0.4.0 it owns device scratch: a context dropped without it leaks
 * that memory). Not thread-safe: see mt_tp_ctx.scratch. */
MT_API mt_status mt_tp_context(mt_mesh *mesh, mt_tp_ctx *out);
/* The same for the dimension named dim: a model whose modules use another tp dimension
 * (mt_module_set_tp_dim) passes that name. */
MT_API mt_status mt_tp_context_dim(mt_mesh *mesh, const char *dim, mt_tp_ctx *out);
/* Frees the context's kept scratch (once, whichever copy of the context is given; the others
 * must not be used with the sequence-parallel functions afterwards). NULL is allowed. */
MT_API void mt_tp_context_release(mt_tp_ctx *tp);
/* Bytes of device scratch the context keeps now (0 without a kept scratch). */
MT_API size_t mt_tp_context_scratch_bytes(const mt_tp_ctx *tp);

/* Every linear backward below takes overwrite: 0, or any of MT_OVERWRITE_D_IN, MT_OVERWRITE_D_W
 * and MT_OVERWRITE_D_BIAS (ops.h): d_in / d_w / d_b are then overwritten instead of accumulated
 * into (a gradient buffer nobody zeroed, module.h's mt_param_grad_write; an activation gradient
 * this op writes first), with the values of accumulating into zeros.
 *
 * The weight is w_dtype (MT_F32 or MT_BF16); everything else, the gradients included, is f32.
 * With MT_BF16 the matrix products take bf16 inputs and accumulate in f32, as
 * mt_op_linear_forward_ex / mt_op_linear_backward_ex do (the input and the output gradient are
 * rounded to bf16 for the products; d_w is the f32 gradient of the bf16 weight).
 *
 * Column-parallel, n rows. in: n x in_features (replicated); w_local: out_features_local x
 * in_features; b_local: out_features_local (may be NULL); out_local: n x out_features_local.
 * Backward: d_in (n x in_features, may be NULL) += all-reduce over tp of d_out_local * w_local;
 * d_w, d_b accumulate. */
MT_API
mt_status mt_tp_column_linear_forward(const mt_tp_ctx *tp, const float *in, const void *w_local,
                                      mt_dtype w_dtype, const float *b_local, float *out_local,
                                      int n, int in_features, int out_features_local);
MT_API
mt_status mt_tp_column_linear_backward(const mt_tp_ctx *tp, const float *d_out_local,
                                       const float *in, const void *w_local, mt_dtype w_dtype,
                                       float *d_in, float *d_w, float *d_b, int n,
                                       int in_features, int out_features_local,
                                       unsigned overwrite);

/* Row-parallel. in_local: n x in_features_local; w_local: out_features x in_features_local; b:
 * out_features (replicated, may be NULL); out: n x out_features = all-reduce over tp of
 * in_local * w_local^T, then + b. Backward: d_in_local += d_out * w_local; d_w += d_out^T *
 * in_local; d_b += column sums of d_out (every tp rank computes the same, the parameter being
 * replicated). */
MT_API
mt_status mt_tp_row_linear_forward(const mt_tp_ctx *tp, const float *in_local,
                                   const void *w_local, mt_dtype w_dtype, const float *b,
                                   float *out, int n, int in_features_local, int out_features);
MT_API
mt_status mt_tp_row_linear_backward(const mt_tp_ctx *tp, const float *d_out,
                                    const float *in_local, const void *w_local, mt_dtype w_dtype,
                                    float *d_in_local, float *d_w, float *d_b, int n,
                                    int in_features_local, int out_features, unsigned overwrite);

/* ids: n token ids in [0, vocab); wte_local: (vocab / tp) x channels, rows [rank * vocab/tp, ...);
 * out: n x channels = the full lookup (all-reduced). Backward: d_wte_local += d_out rows of the
 * ids in this rank's slice. */
MT_API
mt_status mt_tp_vocab_embedding_forward(const mt_tp_ctx *tp, const int *ids, int n,
                                        const float *wte_local, int vocab_local, int channels,
                                        float *out);
MT_API mt_status mt_tp_vocab_embedding_backward(const mt_tp_ctx *tp, const int *ids, int n,
                                                const float *d_out, int vocab_local, int channels,
                                                float *d_wte_local);

/* logits_local: n x vocab_local (this rank's vocabulary slice); targets: n ids. *loss_sum gets
 * the sum over the n rows of the cross-entropy (the same on every tp rank); d_logits_local (may
 * be NULL) += scale * (softmax - onehot) on the slice. */
MT_API mt_status mt_tp_vocab_cross_entropy(const mt_tp_ctx *tp, const float *logits_local,
                                           const int *targets, int n, int vocab_local, float scale,
                                           float *loss_sum, float *d_logits_local);

/* mt_tp_vocab_cross_entropy on the slice [start, start + vocab_local) of the vocabulary, which
 * need not be [rank * vocab_local, ...) nor the same size on every rank: with a vocabulary padded
 * to a multiple of tp, the last ranks hold fewer real columns and pass only those (the GPT's LM
 * head does). The ranks' slices together must hold every target id once. *loss_sum (required)
 * gets the sum over the n rows in double, the same on every tp rank. */
MT_API
mt_status mt_tp_vocab_cross_entropy_range(const mt_tp_ctx *tp, const float *logits_local,
                                          const int *targets, int n, int start, int vocab_local,
                                          float scale, double *loss_sum,
                                          float *d_logits_local);

/* ---- sequence parallelism --------------------------------------------------------------------
 * An activation of n rows (batch * seq tokens, row-major, flattened) is split over tp into
 * contiguous blocks: tp rank r holds rows [r * n / tp, (r + 1) * n / tp) (a "shard", n / tp
 * rows). Every per-token operation (LayerNorm, residual add, position embedding: position =
 * global row % seq) runs on the shard unchanged. n is the global row count everywhere below and
 * must be divisible by tp. The column-parallel input is needed whole again in backward (for the
 * weight gradient); two ways to have it:
 *   re-gather (mt_tp_column_linear_forward_sp / _backward_sp, Megatron's choice): backward
 *     all-gathers the shard again; one more all-gather per column-parallel backward, and only
 *     the shard is ever kept;
 *   keep gathered (mt_tp_column_linear_forward_sp_gathered / _backward_sp_gathered): forward
 *     gathers into a caller's buffer, which the caller keeps for backward; the traffic is that
 *     of the replicated layers, at the cost of n x in_features kept per column-parallel linear. */

/* MT_ERR_INVALID_ARG "sequence parallelism: seq S not divisible by tp T" unless tp divides seq
 * (Megatron's condition; it makes every batch's rows split evenly). */
MT_API mt_status mt_tp_sequence_check(const mt_tp_ctx *tp, int seq);

/* out (n x channels) = every rank's in_shard (n / tp rows) in rank order. */
MT_API mt_status mt_tp_sequence_gather(const mt_tp_ctx *tp, const float *in_shard, float *out,
                                       int n, int channels);
/* out_shard (n / tp x channels) = this rank's rows of the sum over tp of in (n x channels). */
MT_API mt_status mt_tp_sequence_reduce_scatter(const mt_tp_ctx *tp, const float *in,
                                               float *out_shard, int n, int channels);

/* Column-parallel with a sequence-parallel input: in_shard (n / tp x in_features) is gathered,
 * out_local is n x out_features_local as mt_tp_column_linear_forward's. Backward gathers
 * in_shard again for d_w; d_in_shard (n / tp x in_features, may be NULL) += this rank's rows
 * of the sum over tp of d_out_local * w_local (a reduce-scatter); d_w, d_b accumulate. */
MT_API
mt_status mt_tp_column_linear_forward_sp(const mt_tp_ctx *tp, const float *in_shard,
                                         const void *w_local, mt_dtype w_dtype,
                                         const float *b_local, float *out_local, int n,
                                         int in_features, int out_features_local);
MT_API
mt_status mt_tp_column_linear_backward_sp(const mt_tp_ctx *tp, const float *d_out_local,
                                          const float *in_shard, const void *w_local,
                                          mt_dtype w_dtype, float *d_in_shard, float *d_w,
                                          float *d_b, int n, int in_features,
                                          int out_features_local, unsigned overwrite);

/* Column-parallel with a sequence-parallel input kept gathered: forward all-gathers in_shard
 * into in_full (n x in_features, the caller's, to keep until backward), then computes out_local
 * as mt_tp_column_linear_forward_sp. Backward takes that in_full (no communication for it) and
 * is otherwise mt_tp_column_linear_backward_sp: d_in_shard (may be NULL) += this rank's rows of
 * the reduce-scattered input gradient; d_w, d_b accumulate. */
MT_API
mt_status mt_tp_column_linear_forward_sp_gathered(const mt_tp_ctx *tp, const float *in_shard,
                                                  float *in_full, const void *w_local,
                                                  mt_dtype w_dtype, const float *b_local,
                                                  float *out_local, int n, int in_features,
                                                  int out_features_local);
MT_API
mt_status mt_tp_column_linear_backward_sp_gathered(const mt_tp_ctx *tp,
                                                   const float *d_out_local,
                                                   const float *in_full, const void *w_local,
                                                   mt_dtype w_dtype, float *d_in_shard,
                                                   float *d_w, float *d_b, int n,
                                                   int in_features, int out_features_local,
                                                   unsigned overwrite);

/* Row-parallel with a sequence-parallel output: out_shard (n / tp x out_features) = this rank's
 * rows of the sum over tp of in_local * w_local^T, + b (reduce-scatter). Backward gathers
 * d_out_shard, then as mt_tp_row_linear_backward: d_b is the full bias gradient on every rank. */
MT_API
mt_status mt_tp_row_linear_forward_sp(const mt_tp_ctx *tp, const float *in_local,
                                      const void *w_local, mt_dtype w_dtype, const float *b,
                                      float *out_shard, int n, int in_features_local,
                                      int out_features);
MT_API
mt_status mt_tp_row_linear_backward_sp(const mt_tp_ctx *tp, const float *d_out_shard,
                                       const float *in_local, const void *w_local,
                                       mt_dtype w_dtype, float *d_in_local, float *d_w,
                                       float *d_b, int n, int in_features_local,
                                       int out_features, unsigned overwrite);

/* The vocab-parallel lookup of all n ids, reduce-scattered: out_shard (n / tp x channels) is
 * this rank's rows of the full lookup. Its backward is mt_tp_vocab_embedding_backward on the
 * gathered output gradient (mt_tp_sequence_gather). */
MT_API
mt_status mt_tp_vocab_embedding_forward_sp(const mt_tp_ctx *tp, const int *ids, int n,
                                           const float *wte_local, int vocab_local, int channels,
                                           float *out_shard);
/* out_shard += wpe's rows of this rank's rows' positions (global row % seq); wpe: seq x
 * channels; n: a whole number of sequences. */
MT_API
mt_status mt_tp_sequence_position_forward(const mt_tp_ctx *tp, const float *wpe, int n, int seq,
                                          int channels, float *out_shard);

/* A replicated parameter applied per row on the shard (a LayerNorm's weight and bias) gets only
 * this rank's rows' gradient: part (count values) becomes its sum over tp, in place, the same on
 * every rank. part must hold this pass's contribution alone, to be added to the gradient after:
 * summing a gradient buffer that accumulates over micro-batches would count earlier ones tp
 * times. */
MT_API mt_status mt_tp_sequence_grad_sum(const mt_tp_ctx *tp, float *part, size_t count);

#ifdef __cplusplus
}
#endif
#endif
