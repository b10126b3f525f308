/* Compute ops on device memory, forward and backward, in llm.c's explicit style. The CPU
 * implementations (core/cpu/) use OpenBLAS for matrix products and plain loops otherwise; on a
 * CUDA device (core/cuda/ops_*.cu, cuBLAS for matrix products) pointers are device memory, ops are
 * queued on the legacy default stream (mt_device_compute_stream: how a kernel of your own orders
 * with them) and return before the GPU is done, except mse forward (its loss may be host or device
 * memory), which waits. core/ops.c checks the arguments once and dispatches on
 * the device kind (the vocabulary-parallel cross-entropy's steps, which tp.h's
 * mt_tp_vocab_cross_entropy runs, are internal: core/ops_internal.h). Shapes are row-major; every op
 * returns mt_status. Backward ops accumulate (+=) into gradient outputs; the _into forms below
 * can overwrite some of them instead (MT_OVERWRITE_*). */
#ifndef MESHTRAIN_OPS_H
#define MESHTRAIN_OPS_H

#include <meshtrain/api.h>
#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C[m x n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T; A is m x k after op, B k x n
 * after op; all f32. */
MT_API
mt_status mt_op_gemm(mt_device *dev, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                     const float *a, const float *b, float beta, float *c);

/* Linear layer: out[batch x out] = in[batch x in] * W^T + bias (W is out x in, bias may be NULL).
 * Backward: d_in += d_out * W (d_in may be NULL), dW += d_out^T * in, d_bias += column sums. */
MT_API
mt_status mt_op_linear_forward(mt_device *dev, const float *in, const float *w, const float *bias,
                               float *out, int batch, int in_features, int out_features);
MT_API
mt_status mt_op_linear_backward(mt_device *dev, const float *d_out, const float *in,
                                const float *w, float *d_in, float *d_w, float *d_bias, int batch,
                                int in_features, int out_features);

/* Mean squared error over n values: loss = sum((pred - target)^2) / n; d_pred += 2 (pred -
 * target) / n * scale (scale lets a caller average over more than this call's n). */
MT_API mt_status mt_op_mse_forward(mt_device *dev, const float *pred, const float *target, size_t n,
                                   float *loss);
MT_API
mt_status mt_op_mse_backward(mt_device *dev, const float *pred, const float *target, size_t n,
                             float scale, float *d_pred);

/* One AdamW update of n elements at step t (1-based): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + lr * wd * p. On the CPU device it
 * runs on the rank's thread pool (MT_NUM_THREADS) with the widest vector path the CPU has
 * (MT_ADAMW_ISA forces one); every path and thread count gives the same bits. */
MT_API mt_status mt_op_adamw(mt_device *dev, float *param, const float *grad, float *m, float *v,
                             size_t n, long t, float lr, float beta1, float beta2, float eps,
                             float weight_decay);


/* ---- bf16 matrix products (mixed precision) ---------------------------------------------------- */

/* C[m x n] (f32) = alpha * op(A) * op(B) + beta * C with A and B in ab_dtype (f32 or bf16) and
 * f32 accumulation: cuBLAS GemmEx with bf16 inputs and CUBLAS_COMPUTE_32F on a GPU; on the CPU
 * the same product over the bf16 values widened to f32. f32: exactly mt_op_gemm. */
MT_API
mt_status mt_op_gemm_ex(mt_device *dev, bool trans_a, bool trans_b, int m, int n, int k,
                        float alpha, const void *a, const void *b, mt_dtype ab_dtype, float beta,
                        float *c);

/* Linear layers whose weight is in w_dtype (f32 or bf16), as autocast runs them: with bf16 every
 * matrix product takes bf16 inputs (the f32 input, and in backward the f32 output gradient, are
 * rounded to bf16 in scratch memory charged to activations) and accumulates in f32; the output,
 * the bias, d_in, d_w and d_bias stay f32 (d_w is the f32 gradient of the bf16 weight). f32:
 * exactly mt_op_linear_forward / mt_op_linear_backward. */
MT_API
mt_status mt_op_linear_forward_ex(mt_device *dev, const float *in, const void *w, mt_dtype w_dtype,
                                  const float *bias, float *out, int batch, int in_features,
                                  int out_features);
MT_API
mt_status mt_op_linear_backward_ex(mt_device *dev, const float *d_out, const float *in,
                                   const void *w, mt_dtype w_dtype, float *d_in, float *d_w,
                                   float *d_bias, int batch, int in_features, int out_features);

/* ---- backward ops that overwrite (gradient buffers nobody zeroed) ------------------------------ */

/* The _into forms of backward ops take `overwrite`, a set of these flags: each flagged gradient
 * output is overwritten instead of added into (its old contents are never read, so it may be
 * uninitialised: a gradient FSDP did not zero, mt_param_grad_write in module.h); the others add
 * as in the plain forms, which are the _into forms with overwrite 0. The values are those of
 * adding into a zeroed buffer, bit for bit: each output starts from 0 (the CPU's ops, f32 and
 * bf16 products alike, inside the op, where the zeros cost no extra pass; other devices by
 * zeroing the flagged outputs first). */
#define MT_OVERWRITE_D_IN 1u   /* the input gradient (d_in) */
#define MT_OVERWRITE_D_W 2u    /* the weight's gradient (d_w, d_gamma, d_wpe) */
#define MT_OVERWRITE_D_BIAS 4u /* the bias's gradient (d_bias, d_beta) */

/* mt_op_linear_backward_ex with overwrite (any of the three). */
MT_API
mt_status mt_op_linear_backward_into(mt_device *dev, const float *d_out, const float *in,
                                     const void *w, mt_dtype w_dtype, float *d_in, float *d_w,
                                     float *d_bias, int batch, int in_features, int out_features,
                                     unsigned overwrite);
/* mt_op_layernorm_backward with overwrite (any of the three). */
MT_API mt_status mt_op_layernorm_backward_into(mt_device *dev, const float *d_out,
                                               const float *in, const float *gamma,
                                               const float *mean, const float *rstd, size_t n,
                                               int channels, float *d_in, float *d_gamma,
                                               float *d_beta, unsigned overwrite);
/* mt_op_position_backward with overwrite (MT_OVERWRITE_D_W: d_wpe). */
MT_API mt_status mt_op_position_backward_into(mt_device *dev, const float *d_out, int batch,
                                              int seq, int channels, float *d_wpe,
                                              unsigned overwrite);
/* mt_op_gelu_backward with overwrite (MT_OVERWRITE_D_IN: d_in). */
MT_API mt_status mt_op_gelu_backward_into(mt_device *dev, const float *in, const float *d_out,
                                          float *d_in, size_t n, unsigned overwrite);
/* mt_op_attention_backward with overwrite (MT_OVERWRITE_D_IN: d_qkv, the whole of it). */
MT_API mt_status mt_op_attention_backward_into(mt_device *dev, const float *d_out,
                                               const float *qkv, const float *att, int batch,
                                               int seq, int heads, int head_dim, float *d_qkv,
                                               unsigned overwrite);

/* ---- reductions for gradient clipping ----------------------------------------------------------- */

/* *acc += sum over i of x[i]^2, where acc is one double in the device's memory (so that many
 * calls queue without waiting; read it back once with mt_device_copy). Sums are double on both
 * devices; on a GPU the blocks add into acc atomically, so the last bits may differ between runs. */
MT_API mt_status mt_op_sum_squares(mt_device *dev, const float *x, size_t n, double *acc);

/* x[i] *= factor, in place. Out of place: mt_device_copy, then this. Its backward is this
 * again on the output gradient (d_x = factor * d_out, scaled in place when d_out is not needed
 * afterwards; to accumulate into an existing d_x, scale then mt_op_accumulate). */
MT_API mt_status mt_op_scale(mt_device *dev, float *x, float factor, size_t n);

/* ---- casts (FSDP's low-precision copies and gradient reductions) ------------------------------ */

/* dst (n elements of dst_dtype) = src (n elements of src_dtype), for f32 and bf16 either way;
 * f32 -> bf16 rounds to nearest, ties to even, exactly as mt_f32_to_bf16. */
MT_API mt_status mt_op_cast(mt_device *dev, const void *src, mt_dtype src_dtype, void *dst,
                            mt_dtype dst_dtype, size_t n);
/* dst[i] += src[i], src f32 or bf16 (widened to f32). */
MT_API mt_status mt_op_accumulate(mt_device *dev, float *dst, const void *src, mt_dtype src_dtype,
                                  size_t n);

/* ---- GPT ops (rows = B*T tokens, C channels) ------------------------------------------------- */

/* out[n x C] = (or +=, with accumulate) the rows of a vocabulary slice: token ids in
 * [vocab_start, vocab_start + vocab_local) pick row (id - vocab_start) of wte (vocab_local x C);
 * other ids give 0 (vocab-parallel embedding: the tp ranks' outputs sum to the full lookup).
 * Backward: d_wte[row] += d_out for the ids in the slice. */
MT_API mt_status mt_op_embedding_forward(mt_device *dev, const int *ids, size_t n, const float *wte,
                                         int vocab_start, int vocab_local, int channels, float *out,
                                         bool accumulate);
MT_API
mt_status mt_op_embedding_backward(mt_device *dev, const int *ids, size_t n, const float *d_out,
                                   int vocab_start, int vocab_local, int channels, float *d_wte);

/* Position embedding for B sequences of T tokens: out[b,t,:] += wpe[t,:]; d_wpe[t] += sum over b
 * of d_out[b,t,:]. */
MT_API
mt_status mt_op_position_forward(mt_device *dev, const float *wpe, int batch, int seq, int channels,
                                 float *out);
MT_API mt_status mt_op_position_backward(mt_device *dev, const float *d_out, int batch, int seq,
                                         int channels, float *d_wpe);

/* LayerNorm over the last dimension (eps 1e-5): out = (in - mean) * rstd * gamma + beta; mean and
 * rstd (n each) are saved for backward, which accumulates into d_in, d_gamma, d_beta. */
MT_API mt_status mt_op_layernorm_forward(mt_device *dev, const float *in, const float *gamma,
                                         const float *beta, size_t n, int channels, float *out,
                                         float *mean, float *rstd);
MT_API mt_status mt_op_layernorm_backward(mt_device *dev, const float *d_out, const float *in,
                                          const float *gamma, const float *mean, const float *rstd,
                                          size_t n, int channels, float *d_in, float *d_gamma,
                                          float *d_beta);

/* ---- elementwise activations ----------------------------------------------------------------- */

/* Every activation works on n f32 elements: forward writes out[i] = f(in[i]) (overwrite; out may
 * be in, for an in-place forward), backward adds d_in[i] += f'(x[i]) * d_out[i] (accumulate, like
 * every backward). Backward takes what f' is cheapest to get from at no loss of accuracy: the
 * forward output for relu, tanh and sigmoid (f' is a function of it, 1 - y^2 and y (1 - y): no
 * exp recomputed, and an in-place forward keeps what backward needs), the forward input for silu
 * and gelu (f' is no function of their output: keep the input). Each buffer is read and written
 * element by element, so backward's buffers may alias too. */

/* out = max(in, 0); d_in += d_out where the forward output was positive. */
MT_API mt_status mt_op_relu_forward(mt_device *dev, const float *in, float *out, size_t n);
MT_API
mt_status mt_op_relu_backward(mt_device *dev, const float *out, const float *d_out, float *d_in,
                              size_t n);

/* out = tanh(in); d_in += (1 - out^2) * d_out, from the forward output. */
MT_API mt_status mt_op_tanh_forward(mt_device *dev, const float *in, float *out, size_t n);
MT_API
mt_status mt_op_tanh_backward(mt_device *dev, const float *out, const float *d_out, float *d_in,
                              size_t n);

/* out = 1 / (1 + exp(-in)) (0 and 1 at the extremes, never NaN for finite input);
 * d_in += out * (1 - out) * d_out, from the forward output. Computed from the output, the slopes
 * of sigmoid and tanh are exactly 0 where the output rounds to its limit (|in| above about 17
 * and 9): the usual float result, as in PyTorch. */
MT_API mt_status mt_op_sigmoid_forward(mt_device *dev, const float *in, float *out, size_t n);
MT_API
mt_status mt_op_sigmoid_backward(mt_device *dev, const float *out, const float *d_out, float *d_in,
                                 size_t n);

/* SiLU (swish): out = in * sigmoid(in); d_in += s * (1 + in * (1 - s)) * d_out with
 * s = sigmoid(in), from the forward input (the output alone does not determine it: silu is not
 * one-to-one). At in = -inf the forward is NaN (-inf * 0), and so is the slope at +-inf, as in
 * PyTorch: keep inputs finite. */
MT_API mt_status mt_op_silu_forward(mt_device *dev, const float *in, float *out, size_t n);
MT_API
mt_status mt_op_silu_backward(mt_device *dev, const float *in, const float *d_out, float *d_in,
                              size_t n);

/* GELU, tanh approximation (GPT-2's), the activation convention above; backward from the input. */
MT_API mt_status mt_op_gelu_forward(mt_device *dev, const float *in, float *out, size_t n);
MT_API
mt_status mt_op_gelu_backward(mt_device *dev, const float *in, const float *d_out, float *d_in,
                              size_t n);

/* ---- elementwise arithmetic ------------------------------------------------------------------ */

/* out[i] = a[i] + b[i] (residual; overwrite); out may alias a or b. Its backward has no op of its
 * own: the gradient passes through unchanged, d_a += d_out and d_b += d_out, which is
 * mt_op_accumulate(dev, d_a, d_out, MT_F32, n) (or mt_op_add(dev, d_a, d_out, d_a, n)). */
MT_API mt_status mt_op_add(mt_device *dev, const float *a, const float *b, float *out, size_t n);

/* out[i] = a[i] * b[i] (overwrite); out may alias a or b. Backward: d_a += d_out * b and
 * d_b += d_out * a (accumulate). Either gradient may be NULL (not wanted), and the input only it
 * would read may then be NULL too (d_a alone needs b, d_b alone needs a). d_a and d_b may be the
 * same buffer (a * a gets 2 a d_out); every element is read before it is written, so any buffers
 * may alias. */
MT_API mt_status mt_op_mul(mt_device *dev, const float *a, const float *b, float *out, size_t n);
MT_API
mt_status mt_op_mul_backward(mt_device *dev, const float *a, const float *b, const float *d_out,
                             float *d_a, float *d_b, size_t n);

/* ---- attention (GPT; rows = B*T tokens) ------------------------------------------------------ */

/* Causal self-attention of `heads` heads of size head_dim on B sequences of T tokens. qkv is
 * (B*T) x (3 * heads * head_dim): per token all q heads, then all k heads, then all v heads (the
 * output of a column-parallel QKV projection holding this rank's heads). out is (B*T) x (heads *
 * head_dim); att (B * heads * T * T) keeps the softmax probabilities for backward, which
 * accumulates into d_qkv. Scale 1/sqrt(head_dim). */
MT_API
mt_status mt_op_attention_forward(mt_device *dev, const float *qkv, int batch, int seq, int heads,
                                  int head_dim, float *out, float *att);
MT_API
mt_status mt_op_attention_backward(mt_device *dev, const float *d_out, const float *qkv,
                                   const float *att, int batch, int seq, int heads, int head_dim,
                                   float *d_qkv);

#ifdef __cplusplus
}
#endif
#endif
