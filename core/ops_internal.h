/* Internal: compute ops that are steps of a larger public operation rather than operations of
 * their own. core/ops.c checks and dispatches them like the public ops (include/meshtrain/ops.h),
 * with the same conventions; tp/ and the op tests call them. On a CUDA device the sums and loss
 * steps wait for the GPU (they check the data: a non-finite row maximum); the maximum is queued. */
#ifndef MT_CORE_OPS_INTERNAL_H
#define MT_CORE_OPS_INTERNAL_H

#include <meshtrain/device.h>
#include <meshtrain/status.h>

#include <stddef.h>

/* The local steps of mt_tp_vocab_cross_entropy (include/meshtrain/tp.h): vocabulary-parallel
 * softmax cross-entropy over n rows of vocab_local logits (this rank's slice
 * [vocab_start, vocab_start + vocab_local) of the vocabulary), in three local steps around two
 * all-reduces over tp, so that the full logits are never gathered:
 *   1. row_max[i] = max of the row's local logits                     -> all-reduce MAX
 *   2. sum_exp[i] = sum exp(logit - row_max[i]); target[i] = the target's logit when the target
 *      is in the slice, else 0                                         -> all-reduce SUM of both
 *   3. loss[i] = log(sum_exp[i]) + row_max[i] - target[i];
 *      d_logits += scale * (softmax - onehot(target)) on the slice (scale e.g. 1 / total rows). */
mt_status mt_op_xent_local_max(mt_device *dev, const float *logits, size_t n, int vocab_local,
                               float *row_max);
mt_status mt_op_xent_local_sums(mt_device *dev, const float *logits, const int *targets, size_t n,
                                int vocab_start, int vocab_local, const float *row_max,
                                float *sum_exp, float *target_logit);
mt_status mt_op_xent_loss_backward(mt_device *dev, const float *logits, const int *targets,
                                   size_t n, int vocab_start, int vocab_local,
                                   const float *row_max, const float *sum_exp,
                                   const float *target_logit, float scale, float *loss,
                                   float *d_logits);

#endif
