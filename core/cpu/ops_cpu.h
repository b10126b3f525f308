/* Internal: the CPU implementations of the compute ops (include/meshtrain/ops.h). core/ops.c has
 * already checked the device and every argument that needs no look at the data; these functions
 * only compute (and check values, e.g. a non-finite row maximum). Same meaning and arguments as
 * the public mt_op_* functions, without the device. */
#ifndef MT_CORE_CPU_OPS_CPU_H
#define MT_CORE_CPU_OPS_CPU_H

#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/ops.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>

mt_status mt_cpu_op_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                         const float *a, const float *b, float beta, float *c);
mt_status mt_cpu_op_linear_forward(const float *in, const float *w, const float *bias, float *out,
                                   int batch, int in_features, int out_features);
/* overwrite: MT_OVERWRITE_* (ops.h) */
mt_status mt_cpu_op_linear_backward(const float *d_out, const float *in, const float *w,
                                    float *d_in, float *d_w, float *d_bias, int batch,
                                    int in_features, int out_features, unsigned overwrite);
/* Every row of out (rows x cols) set to bias (zeros when NULL): where the linears' forward
 * products start (beta = 1). */
mt_status mt_cpu_bias_rows(const float *bias, float *out, size_t rows, size_t cols);
/* d_bias[j] += the column sums of g (rows x cols), rows in order (split by columns over the
 * pool, so any thread count gives the same bits): the linear's bias gradient. */
mt_status mt_cpu_add_column_sums(const float *g, size_t rows, size_t cols, float *d_bias);
/* The same, with d_bias starting from 0 when overwrite (its old contents not read). */
mt_status mt_cpu_column_sums(const float *g, size_t rows, size_t cols, float *d_bias,
                             bool overwrite);
/* bf16 products (mt_op_gemm_ex, mt_op_linear_*_ex with bf16): dev is the CPU device, for the
 * scratch copies of rounded inputs (charged to activations). */
mt_status mt_cpu_op_gemm_bf16(mt_device *dev, bool trans_a, bool trans_b, int m, int n, int k,
                              float alpha, const void *a, const void *b, float beta, float *c);
mt_status mt_cpu_op_linear_forward_bf16(mt_device *dev, const float *in, const void *w,
                                        const float *bias, float *out, int batch,
                                        int in_features, int out_features);
/* overwrite: MT_OVERWRITE_* (ops.h), each flagged output written with beta 0 (the bias's sum
 * from 0), never read: the bits of adding into zeros without the pass that zeroes them. */
mt_status mt_cpu_op_linear_backward_bf16(mt_device *dev, const float *d_out, const float *in,
                                         const void *w, float *d_in, float *d_w, float *d_bias,
                                         int batch, int in_features, int out_features,
                                         unsigned overwrite);
mt_status mt_cpu_op_sum_squares(const float *x, size_t n, double *acc);
mt_status mt_cpu_op_scale(float *x, float factor, size_t n);
mt_status mt_cpu_op_relu_forward(const float *in, float *out, size_t n);
mt_status mt_cpu_op_relu_backward(const float *out, const float *d_out, float *d_in, size_t n);
mt_status mt_cpu_op_mse_forward(const float *pred, const float *target, size_t n, float *loss);
mt_status mt_cpu_op_mse_backward(const float *pred, const float *target, size_t n, float scale,
                                 float *d_pred);
mt_status mt_cpu_op_adamw(float *param, const float *grad, float *m, float *v, size_t n, long t,
                          float lr, float beta1, float beta2, float eps, float weight_decay);
/* mt_op_adamw on the gradient grad[i] * grad_scale, with the bits of mt_op_scale then
 * mt_op_adamw; grad is left as it is (core/cpu/adamw_host.h, mt_host_adamw_scaled). */
mt_status mt_cpu_op_adamw_scaled(float *param, const float *grad, float grad_scale, float *m,
                                 float *v, size_t n, long t, float lr, float beta1, float beta2,
                                 float eps, float weight_decay);

mt_status mt_cpu_op_cast(const void *src, mt_dtype src_dtype, void *dst, mt_dtype dst_dtype,
                         size_t n);
mt_status mt_cpu_op_accumulate(float *dst, const void *src, mt_dtype src_dtype, size_t n);

mt_status mt_cpu_op_embedding_forward(const int *ids, size_t n, const float *wte, int vocab_start,
                                      int vocab_local, int channels, float *out, bool accumulate);
mt_status mt_cpu_op_embedding_backward(const int *ids, size_t n, const float *d_out,
                                       int vocab_start, int vocab_local, int channels,
                                       float *d_wte);
mt_status mt_cpu_op_position_forward(const float *wpe, int batch, int seq, int channels,
                                     float *out);
mt_status mt_cpu_op_position_backward(const float *d_out, int batch, int seq, int channels,
                                      float *d_wpe, bool overwrite);
mt_status mt_cpu_op_layernorm_forward(const float *in, const float *gamma, const float *beta,
                                      size_t n, int channels, float *out, float *mean,
                                      float *rstd);
mt_status mt_cpu_op_layernorm_backward(const float *d_out, const float *in, const float *gamma,
                                       const float *mean, const float *rstd, size_t n,
                                       int channels, float *d_in, float *d_gamma, float *d_beta,
                                       unsigned overwrite);
mt_status mt_cpu_op_gelu_forward(const float *in, float *out, size_t n);
/* overwrite: d_in = 0 + gelu'(in) d_out, d_in not read (mt_op_gelu_backward_into). */
mt_status mt_cpu_op_gelu_backward(const float *in, const float *d_out, float *d_in, size_t n,
                                  bool overwrite);
mt_status mt_cpu_op_add(const float *a, const float *b, float *out, size_t n);
/* core/cpu/ops_elementwise.c */
mt_status mt_cpu_op_tanh_forward(const float *in, float *out, size_t n);
mt_status mt_cpu_op_tanh_backward(const float *out, const float *d_out, float *d_in, size_t n);
mt_status mt_cpu_op_sigmoid_forward(const float *in, float *out, size_t n);
mt_status mt_cpu_op_sigmoid_backward(const float *out, const float *d_out, float *d_in,
                                     size_t n);
mt_status mt_cpu_op_silu_forward(const float *in, float *out, size_t n);
mt_status mt_cpu_op_silu_backward(const float *in, const float *d_out, float *d_in, size_t n);
mt_status mt_cpu_op_mul(const float *a, const float *b, float *out, size_t n);
mt_status mt_cpu_op_mul_backward(const float *a, const float *b, const float *d_out, float *d_a,
                                 float *d_b, size_t n);
mt_status mt_cpu_op_attention_forward(const float *qkv, int batch, int seq, int heads,
                                      int head_dim, float *out, float *att);
/* overwrite: d_qkv is written, not added into (mt_op_attention_backward_into). */
mt_status mt_cpu_op_attention_backward(const float *d_out, const float *qkv, const float *att,
                                       int batch, int seq, int heads, int head_dim, float *d_qkv,
                                       bool overwrite);
mt_status mt_cpu_op_xent_local_max(const float *logits, size_t n, int vocab_local,
                                   float *row_max);
mt_status mt_cpu_op_xent_local_sums(const float *logits, const int *targets, size_t n,
                                    int vocab_start, int vocab_local, const float *row_max,
                                    float *sum_exp, float *target_logit);
mt_status mt_cpu_op_xent_loss_backward(const float *logits, const int *targets, size_t n,
                                       int vocab_start, int vocab_local, const float *row_max,
                                       const float *sum_exp, const float *target_logit,
                                       float scale, float *loss, float *d_logits);

#endif
