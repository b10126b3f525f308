/* Compute ops on device memory, forward and backward, in llm.c's explicit style. The CPU
 * implementations (core/cpu/) use OpenBLAS for matrix products and plain loops otherwise; a CUDA
 * device gets its own implementations later. Shapes are row-major; every op checks its device
 * and arguments and returns mt_status. Backward ops accumulate (+=) into gradient outputs. */
#ifndef MESHTRAIN_OPS_H
#define MESHTRAIN_OPS_H

#include <meshtrain/device.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C[m x n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T; A is m x k after op, B k x n
 * after op; all f32. */
mt_status mt_op_gemm(mt_device *dev, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                     const float *a, const float *b, float beta, float *c);

/* Linear layer: out[batch x out] = in[batch x in] * W^T + bias (W is out x in, bias may be NULL).
 * Backward: d_in += d_out * W (d_in may be NULL), dW += d_out^T * in, d_bias += column sums. */
mt_status mt_op_linear_forward(mt_device *dev, const float *in, const float *w, const float *bias,
                               float *out, int batch, int in_features, int out_features);
mt_status mt_op_linear_backward(mt_device *dev, const float *d_out, const float *in,
                                const float *w, float *d_in, float *d_w, float *d_bias, int batch,
                                int in_features, int out_features);

/* out = max(in, 0); d_in += d_out where the forward output was positive. */
mt_status mt_op_relu_forward(mt_device *dev, const float *in, float *out, size_t n);
mt_status mt_op_relu_backward(mt_device *dev, const float *out, const float *d_out, float *d_in,
                              size_t n);

/* Mean squared error over n values: loss = sum((pred - target)^2) / n; d_pred += 2 (pred -
 * target) / n * scale (scale lets a caller average over more than this call's n). */
mt_status mt_op_mse_forward(mt_device *dev, const float *pred, const float *target, size_t n,
                            float *loss);
mt_status mt_op_mse_backward(mt_device *dev, const float *pred, const float *target, size_t n,
                             float scale, float *d_pred);

/* One AdamW update of n elements at step t (1-based): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + lr * wd * p. */
mt_status mt_op_adamw(mt_device *dev, float *param, const float *grad, float *m, float *v,
                      size_t n, long t, float lr, float beta1, float beta2, float eps,
                      float weight_decay);

#ifdef __cplusplus
}
#endif
#endif
