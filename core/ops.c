/* The public compute ops (include/meshtrain/ops.h): each checks its arguments once, then runs the
 * implementation of the device's kind, core/cpu/ops_*.c or core/cuda/ops_*.cu. Checks that need
 * to look at the data (a non-finite row maximum) stay with each implementation. */
#include "core/cpu/ops_check.h"
#include "core/cpu/ops_cpu.h"
#include "core/error.h"
#include "core/ops_internal.h"

#include <meshtrain/ops.h>

#ifdef MT_HAVE_CUDA
#include "core/cuda/ops_cuda.h"
/* The CUDA implementation of an op, on a CUDA device. */
#define CUDA_OP(dev, op, call) (call)
#else
/* Without CUDA support no CUDA device can be opened (mt_device_open falls back to the CPU), but a
 * sentence is better than a crash should one ever arrive here. */
#define CUDA_OP(dev, op, call) no_cuda(dev, op)
static mt_status no_cuda(mt_device *dev, const char *op) {
    return mt_error(MT_ERR_UNSUPPORTED,
                    "%s: no implementation for device %s (this build has no CUDA support)", op,
                    mt_device_name(dev));
}
#endif

static mt_status check_device(mt_device *dev, const char *op) {
    if (!dev) return mt_error(MT_ERR_INVALID_ARG, "%s: the device is NULL", op);
    return MT_OK;
}

static bool on_cpu(mt_device *dev) { return mt_device_get_kind(dev) == MT_DEVICE_CPU; }

/* The checks of an elementwise op over n elements: the device, then each named buffer (a third
 * may be absent: name NULL). */
static mt_status check_elementwise(mt_device *dev, const char *op, size_t n, const void *a,
                                   const char *a_name, const void *b, const char *b_name,
                                   const void *c, const char *c_name) {
    MT_TRY(check_device(dev, op));
    MT_TRY(check_ptr(a, n, op, a_name));
    MT_TRY(check_ptr(b, n, op, b_name));
    return c_name ? check_ptr(c, n, op, c_name) : MT_OK;
}

/* ---- casts ----------------------------------------------------------------------------------- */

/* The dtypes the casts and the mixed-precision products take. */
static mt_status check_float_dtype(mt_dtype dt, const char *op, const char *what) {
    if (dt != MT_F32 && dt != MT_BF16)
        return mt_error(MT_ERR_INVALID_ARG, "%s: %s dtype %d is neither f32 nor bf16", op, what,
                        (int)dt);
    return MT_OK;
}

mt_status mt_op_cast(mt_device *dev, const void *src, mt_dtype src_dtype, void *dst,
                     mt_dtype dst_dtype, size_t n) {
    static const char *op = "cast";
    MT_TRY(check_device(dev, op));
    MT_TRY(check_float_dtype(src_dtype, op, "the source"));
    MT_TRY(check_float_dtype(dst_dtype, op, "the destination"));
    MT_TRY(check_ptr(src, n, op, "the source"));
    MT_TRY(check_ptr(dst, n, op, "the destination"));
    if (on_cpu(dev)) return mt_cpu_op_cast(src, src_dtype, dst, dst_dtype, n);
    return CUDA_OP(dev, op, mt_cuda_op_cast(dev, src, src_dtype, dst, dst_dtype, n));
}

mt_status mt_op_accumulate(mt_device *dev, float *dst, const void *src, mt_dtype src_dtype,
                           size_t n) {
    static const char *op = "accumulate";
    MT_TRY(check_device(dev, op));
    MT_TRY(check_float_dtype(src_dtype, op, "the source"));
    MT_TRY(check_ptr(src, n, op, "the source"));
    MT_TRY(check_ptr(dst, n, op, "the destination"));
    if (on_cpu(dev)) return mt_cpu_op_accumulate(dst, src, src_dtype, n);
    return CUDA_OP(dev, op, mt_cuda_op_accumulate(dev, dst, src, src_dtype, n));
}

/* The checks of a linear layer's forward and backward, whatever the weight's dtype. */
static mt_status check_linear_forward(mt_device *dev, const char *op, const void *in,
                                      const void *w, const void *out, int batch, int in_features,
                                      int out_features) {
    MT_TRY(check_device(dev, op));
    MT_TRY(check_linear(op, batch, in_features, out_features));
    size_t rows = (size_t)batch, cols = (size_t)out_features;
    MT_TRY(check_ptr(in, rows * (size_t)in_features, op, "the input"));
    MT_TRY(check_ptr(w, cols * (size_t)in_features, op, "the weight"));
    return check_ptr(out, rows * cols, op, "the output");
}

static mt_status check_linear_backward(mt_device *dev, const char *op, const void *d_out,
                                       const void *in, const void *w, const void *d_in,
                                       const void *d_w, int batch, int in_features,
                                       int out_features) {
    MT_TRY(check_device(dev, op));
    MT_TRY(check_linear(op, batch, in_features, out_features));
    size_t rows = (size_t)batch, cols = (size_t)out_features;
    MT_TRY(check_ptr(d_out, rows * cols, op, "the output gradient"));
    MT_TRY(check_ptr(in, rows * (size_t)in_features, op, "the input"));
    if (d_in) MT_TRY(check_ptr(w, cols * (size_t)in_features, op, "the weight"));
    return check_ptr(d_w, cols * (size_t)in_features, op, "the weight gradient");
}

/* ---- matrix products and the MLP ops --------------------------------------------------------- */

/* The checks of a matrix product, whatever the dtype of A and B. */
static mt_status check_gemm(mt_device *dev, const char *op, int m, int n, int k, const void *a,
                            const void *b, const float *c) {
    MT_TRY(check_device(dev, op));
    if (m < 0 || n < 0 || k < 0)
        return mt_error(MT_ERR_INVALID_ARG, "%s: negative size (m %d, n %d, k %d)", op, m, n, k);
    MT_TRY(check_ptr(a, (size_t)m * (size_t)k, op, "A"));
    MT_TRY(check_ptr(b, (size_t)k * (size_t)n, op, "B"));
    return check_ptr(c, (size_t)m * (size_t)n, op, "C");
}

mt_status mt_op_gemm(mt_device *dev, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                     const float *a, const float *b, float beta, float *c) {
    static const char *op = "gemm";
    MT_TRY(check_gemm(dev, op, m, n, k, a, b, c));
    if (on_cpu(dev)) return mt_cpu_op_gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
    return CUDA_OP(dev, op,
                   mt_cuda_op_gemm(dev, trans_a, trans_b, m, n, k, alpha, a, b, beta, c));
}

mt_status mt_op_linear_forward(mt_device *dev, const float *in, const float *w, const float *bias,
                               float *out, int batch, int in_features, int out_features) {
    static const char *op = "linear_forward";
    MT_TRY(check_linear_forward(dev, op, in, w, out, batch, in_features, out_features));
    if (on_cpu(dev))
        return mt_cpu_op_linear_forward(in, w, bias, out, batch, in_features, out_features);
    return CUDA_OP(dev, op,
                   mt_cuda_op_linear_forward(dev, in, w, bias, out, batch, in_features,
                                             out_features));
}

mt_status mt_op_linear_backward(mt_device *dev, const float *d_out, const float *in,
                                const float *w, float *d_in, float *d_w, float *d_bias, int batch,
                                int in_features, int out_features) {
    static const char *op = "linear_backward";
    MT_TRY(check_linear_backward(dev, op, d_out, in, w, d_in, d_w, batch, in_features,
                                 out_features));
    if (on_cpu(dev))
        return mt_cpu_op_linear_backward(d_out, in, w, d_in, d_w, d_bias, batch, in_features,
                                         out_features, 0);
    return CUDA_OP(dev, op,
                   mt_cuda_op_linear_backward(dev, d_out, in, w, d_in, d_w, d_bias, batch,
                                              in_features, out_features));
}

/* ---- bf16 matrix products -------------------------------------------------------------------- */

mt_status mt_op_gemm_ex(mt_device *dev, bool trans_a, bool trans_b, int m, int n, int k,
                        float alpha, const void *a, const void *b, mt_dtype ab_dtype, float beta,
                        float *c) {
    static const char *op = "gemm_ex";
    MT_TRY(check_float_dtype(ab_dtype, op, "input"));
    if (ab_dtype == MT_F32) return mt_op_gemm(dev, trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
    MT_TRY(check_gemm(dev, op, m, n, k, a, b, c));
    if (on_cpu(dev))
        return mt_cpu_op_gemm_bf16(dev, trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
    return CUDA_OP(dev, op,
                   mt_cuda_op_gemm_bf16(dev, trans_a, trans_b, m, n, k, alpha, a, b, beta, c));
}

mt_status mt_op_linear_forward_ex(mt_device *dev, const float *in, const void *w, mt_dtype w_dtype,
                                  const float *bias, float *out, int batch, int in_features,
                                  int out_features) {
    static const char *op = "linear_forward_ex";
    MT_TRY(check_float_dtype(w_dtype, op, "input"));
    if (w_dtype == MT_F32)
        return mt_op_linear_forward(dev, in, w, bias, out, batch, in_features, out_features);
    MT_TRY(check_linear_forward(dev, op, in, w, out, batch, in_features, out_features));
    if (on_cpu(dev))
        return mt_cpu_op_linear_forward_bf16(dev, in, w, bias, out, batch, in_features,
                                             out_features);
    return CUDA_OP(dev, op,
                   mt_cuda_op_linear_forward_bf16(dev, in, w, bias, out, batch, in_features,
                                                  out_features));
}

mt_status mt_op_linear_backward_ex(mt_device *dev, const float *d_out, const float *in,
                                   const void *w, mt_dtype w_dtype, float *d_in, float *d_w,
                                   float *d_bias, int batch, int in_features, int out_features) {
    static const char *op = "linear_backward_ex";
    MT_TRY(check_float_dtype(w_dtype, op, "input"));
    if (w_dtype == MT_F32)
        return mt_op_linear_backward(dev, d_out, in, w, d_in, d_w, d_bias, batch, in_features,
                                     out_features);
    MT_TRY(check_linear_backward(dev, op, d_out, in, w, d_in, d_w, batch, in_features,
                                 out_features));
    if (on_cpu(dev))
        return mt_cpu_op_linear_backward_bf16(dev, d_out, in, w, d_in, d_w, d_bias, batch,
                                              in_features, out_features, 0);
    return CUDA_OP(dev, op,
                   mt_cuda_op_linear_backward_bf16(dev, d_out, in, w, d_in, d_w, d_bias, batch,
                                                   in_features, out_features));
}

/* ---- reductions for gradient clipping -------------------------------------------------------- */

mt_status mt_op_sum_squares(mt_device *dev, const float *x, size_t n, double *acc) {
    static const char *op = "sum_squares";
    MT_TRY(check_device(dev, op));
    MT_TRY(check_ptr(x, n, op, "the input"));
    MT_TRY(check_ptr(acc, 1, op, "the accumulator"));
    if (on_cpu(dev)) return mt_cpu_op_sum_squares(x, n, acc);
    return CUDA_OP(dev, op, mt_cuda_op_sum_squares(dev, x, n, acc));
}

mt_status mt_op_scale(mt_device *dev, float *x, float factor, size_t n) {
    static const char *op = "scale";
    MT_TRY(check_device(dev, op));
    MT_TRY(check_ptr(x, n, op, "the input"));
    if (on_cpu(dev)) return mt_cpu_op_scale(x, factor, n);
    return CUDA_OP(dev, op, mt_cuda_op_scale(dev, x, factor, n));
}

/* ---- elementwise activations ---------------------------------------------------------------- */

/* An activation's implementations: forward maps in to out, backward accumulates into d_in from
 * d_out and what the forward saved (its output or its input, per op). In a build without CUDA
 * the CUDA entry is NULL and never called (CUDA_OP drops the call). */
typedef mt_status (*cpu_map_fn)(const float *in, float *out, size_t n);
typedef mt_status (*cpu_map_grad_fn)(const float *saved, const float *d_out, float *d_in,
                                     size_t n);
typedef mt_status (*cuda_map_fn)(mt_device *dev, const float *in, float *out, size_t n);
typedef mt_status (*cuda_map_grad_fn)(mt_device *dev, const float *saved, const float *d_out,
                                      float *d_in, size_t n);

/* ---- backward ops that overwrite: shared checks ----------------------------------------------- */

static mt_status check_overwrite(const char *op, unsigned overwrite, unsigned allowed) {
    if (!(overwrite & ~allowed)) return MT_OK;
    return mt_error(MT_ERR_INVALID_ARG, "%s: overwrite flags 0x%x name outputs it does not have "
                    "(allowed: 0x%x, MT_OVERWRITE_* in ops.h)", op, overwrite, allowed);
}

/* Where a backend only adds (CUDA): the flagged outputs are zeroed first, which gives the bits
 * the CPU's overwrite gives (it starts from 0 inside the op), at one more pass. */
static mt_status zero_flagged(mt_device *dev, const char *op, unsigned overwrite, unsigned flag,
                              float *p, size_t n) {
    if (!(overwrite & flag) || !p || n == 0) return MT_OK;
    mt_status st = mt_device_memset(dev, p, 0, n * sizeof(float), NULL);
    if (st != MT_OK) return mt_error_wrap(st, "%s: zeroing an output it overwrites", op);
    return MT_OK;
}

#ifdef MT_HAVE_CUDA
#define CUDA_IMPL(f) (f)
#else
#define CUDA_IMPL(f) NULL
#endif

static mt_status activation_forward(mt_device *dev, const char *op, const float *in, float *out,
                                    size_t n, cpu_map_fn cpu, cuda_map_fn cuda) {
    MT_TRY(check_elementwise(dev, op, n, in, "the input", out, "the output", NULL, NULL));
    if (on_cpu(dev)) return cpu(in, out, n);
    return CUDA_OP(dev, op, cuda(dev, in, out, n));
}

/* saved_name says which the op keeps: "the forward output" or "the input". */
static mt_status activation_backward(mt_device *dev, const char *op, const float *saved,
                                     const char *saved_name, const float *d_out, float *d_in,
                                     size_t n, cpu_map_grad_fn cpu, cuda_map_grad_fn cuda) {
    MT_TRY(check_elementwise(dev, op, n, saved, saved_name, d_out, "the output gradient", d_in,
                             "the input gradient"));
    if (on_cpu(dev)) return cpu(saved, d_out, d_in, n);
    return CUDA_OP(dev, op, cuda(dev, saved, d_out, d_in, n));
}

mt_status mt_op_relu_forward(mt_device *dev, const float *in, float *out, size_t n) {
    return activation_forward(dev, "relu_forward", in, out, n, mt_cpu_op_relu_forward,
                              CUDA_IMPL(mt_cuda_op_relu_forward));
}

mt_status mt_op_relu_backward(mt_device *dev, const float *out, const float *d_out, float *d_in,
                              size_t n) {
    return activation_backward(dev, "relu_backward", out, "the forward output", d_out, d_in, n,
                               mt_cpu_op_relu_backward, CUDA_IMPL(mt_cuda_op_relu_backward));
}

mt_status mt_op_tanh_forward(mt_device *dev, const float *in, float *out, size_t n) {
    return activation_forward(dev, "tanh_forward", in, out, n, mt_cpu_op_tanh_forward,
                              CUDA_IMPL(mt_cuda_op_tanh_forward));
}

mt_status mt_op_tanh_backward(mt_device *dev, const float *out, const float *d_out, float *d_in,
                              size_t n) {
    return activation_backward(dev, "tanh_backward", out, "the forward output", d_out, d_in, n,
                               mt_cpu_op_tanh_backward, CUDA_IMPL(mt_cuda_op_tanh_backward));
}

mt_status mt_op_sigmoid_forward(mt_device *dev, const float *in, float *out, size_t n) {
    return activation_forward(dev, "sigmoid_forward", in, out, n, mt_cpu_op_sigmoid_forward,
                              CUDA_IMPL(mt_cuda_op_sigmoid_forward));
}

mt_status mt_op_sigmoid_backward(mt_device *dev, const float *out, const float *d_out, float *d_in,
                                 size_t n) {
    return activation_backward(dev, "sigmoid_backward", out, "the forward output", d_out, d_in, n,
                               mt_cpu_op_sigmoid_backward,
                               CUDA_IMPL(mt_cuda_op_sigmoid_backward));
}

mt_status mt_op_silu_forward(mt_device *dev, const float *in, float *out, size_t n) {
    return activation_forward(dev, "silu_forward", in, out, n, mt_cpu_op_silu_forward,
                              CUDA_IMPL(mt_cuda_op_silu_forward));
}

mt_status mt_op_silu_backward(mt_device *dev, const float *in, const float *d_out, float *d_in,
                              size_t n) {
    return activation_backward(dev, "silu_backward", in, "the input", d_out, d_in, n,
                               mt_cpu_op_silu_backward, CUDA_IMPL(mt_cuda_op_silu_backward));
}

mt_status mt_op_gelu_forward(mt_device *dev, const float *in, float *out, size_t n) {
    return activation_forward(dev, "gelu_forward", in, out, n, mt_cpu_op_gelu_forward,
                              CUDA_IMPL(mt_cuda_op_gelu_forward));
}

static mt_status cpu_gelu_backward_add(const float *in, const float *d_out, float *d_in,
                                       size_t n) {
    return mt_cpu_op_gelu_backward(in, d_out, d_in, n, false);
}

static mt_status cpu_gelu_backward_overwrite(const float *in, const float *d_out, float *d_in,
                                             size_t n) {
    return mt_cpu_op_gelu_backward(in, d_out, d_in, n, true);
}

mt_status mt_op_gelu_backward(mt_device *dev, const float *in, const float *d_out, float *d_in,
                              size_t n) {
    return activation_backward(dev, "gelu_backward", in, "the input", d_out, d_in, n,
                               cpu_gelu_backward_add, CUDA_IMPL(mt_cuda_op_gelu_backward));
}

mt_status mt_op_mse_forward(mt_device *dev, const float *pred, const float *target, size_t n,
                            float *loss) {
    static const char *op = "mse_forward";
    MT_TRY(check_device(dev, op));
    if (n == 0) return mt_error(MT_ERR_INVALID_ARG, "%s: no values (the mean of 0 values)", op);
    MT_TRY(check_ptr(pred, n, op, "the prediction"));
    MT_TRY(check_ptr(target, n, op, "the target"));
    MT_TRY(check_ptr(loss, 1, op, "the loss output"));
    if (on_cpu(dev)) return mt_cpu_op_mse_forward(pred, target, n, loss);
    return CUDA_OP(dev, op, mt_cuda_op_mse_forward(dev, pred, target, n, loss));
}

mt_status mt_op_mse_backward(mt_device *dev, const float *pred, const float *target, size_t n,
                             float scale, float *d_pred) {
    static const char *op = "mse_backward";
    MT_TRY(check_device(dev, op));
    if (n == 0) return mt_error(MT_ERR_INVALID_ARG, "%s: no values (the mean of 0 values)", op);
    MT_TRY(check_ptr(pred, n, op, "the prediction"));
    MT_TRY(check_ptr(target, n, op, "the target"));
    MT_TRY(check_ptr(d_pred, n, op, "the prediction gradient"));
    if (on_cpu(dev)) return mt_cpu_op_mse_backward(pred, target, n, scale, d_pred);
    return CUDA_OP(dev, op, mt_cuda_op_mse_backward(dev, pred, target, n, scale, d_pred));
}

mt_status mt_op_adamw(mt_device *dev, float *param, const float *grad, float *m, float *v,
                      size_t n, long t, float lr, float beta1, float beta2, float eps,
                      float weight_decay) {
    static const char *op = "adamw";
    MT_TRY(check_device(dev, op));
    MT_TRY(check_ptr(param, n, op, "the parameter"));
    MT_TRY(check_ptr(grad, n, op, "the gradient"));
    MT_TRY(check_ptr(m, n, op, "the first moment"));
    MT_TRY(check_ptr(v, n, op, "the second moment"));
    if (t < 1) return mt_error(MT_ERR_INVALID_ARG, "%s: step %ld (steps count from 1)", op, t);
    if (!(beta1 >= 0.0f && beta1 < 1.0f) || !(beta2 >= 0.0f && beta2 < 1.0f))
        return mt_error(MT_ERR_INVALID_ARG, "%s: betas (%g, %g) outside [0, 1)", op,
                        (double)beta1, (double)beta2);
    if (on_cpu(dev))
        return mt_cpu_op_adamw(param, grad, m, v, n, t, lr, beta1, beta2, eps, weight_decay);
    return CUDA_OP(dev, op,
                   mt_cuda_op_adamw(dev, param, grad, m, v, n, t, lr, beta1, beta2, eps,
                                    weight_decay));
}

/* ---- GPT ops --------------------------------------------------------------------------------- */

mt_status mt_op_embedding_forward(mt_device *dev, const int *ids, size_t n, const float *wte,
                                  int vocab_start, int vocab_local, int channels, float *out,
                                  bool accumulate) {
    static const char *op = "embedding_forward";
    MT_TRY(check_device(dev, op));
    MT_TRY(check_slice(op, vocab_start, vocab_local));
    MT_TRY(check_nonneg(op, "channel count", channels));
    size_t c = (size_t)channels;
    MT_TRY(check_ptr(ids, n, op, "the token ids"));
    MT_TRY(check_ptr(wte, (size_t)vocab_local * c, op, "the embedding table"));
    MT_TRY(check_ptr(out, n * c, op, "the output"));
    if (on_cpu(dev))
        return mt_cpu_op_embedding_forward(ids, n, wte, vocab_start, vocab_local, channels, out,
                                           accumulate);
    return CUDA_OP(dev, op,
                   mt_cuda_op_embedding_forward(dev, ids, n, wte, vocab_start, vocab_local,
                                                channels, out, accumulate));
}

mt_status mt_op_embedding_backward(mt_device *dev, const int *ids, size_t n, const float *d_out,
                                   int vocab_start, int vocab_local, int channels, float *d_wte) {
    static const char *op = "embedding_backward";
    MT_TRY(check_device(dev, op));
    MT_TRY(check_slice(op, vocab_start, vocab_local));
    MT_TRY(check_nonneg(op, "channel count", channels));
    size_t c = (size_t)channels;
    MT_TRY(check_ptr(ids, n, op, "the token ids"));
    MT_TRY(check_ptr(d_out, n * c, op, "the output gradient"));
    MT_TRY(check_ptr(d_wte, (size_t)vocab_local * c, op, "the embedding gradient"));
    if (on_cpu(dev))
        return mt_cpu_op_embedding_backward(ids, n, d_out, vocab_start, vocab_local, channels,
                                            d_wte);
    return CUDA_OP(dev, op,
                   mt_cuda_op_embedding_backward(dev, ids, n, d_out, vocab_start, vocab_local,
                                                 channels, d_wte));
}

mt_status mt_op_position_forward(mt_device *dev, const float *wpe, int batch, int seq, int channels,
                                 float *out) {
    static const char *op = "position_forward";
    MT_TRY(check_device(dev, op));
    MT_TRY(check_btc(op, batch, seq, channels));
    size_t t_n = (size_t)seq, c = (size_t)channels;
    MT_TRY(check_ptr(wpe, t_n * c, op, "the position table"));
    MT_TRY(check_ptr(out, (size_t)batch * t_n * c, op, "the output"));
    if (on_cpu(dev)) return mt_cpu_op_position_forward(wpe, batch, seq, channels, out);
    return CUDA_OP(dev, op, mt_cuda_op_position_forward(dev, wpe, batch, seq, channels, out));
}

static mt_status check_position_backward(mt_device *dev, const char *op, const float *d_out,
                                        int batch, int seq, int channels, const float *d_wpe) {
    MT_TRY(check_device(dev, op));
    MT_TRY(check_btc(op, batch, seq, channels));
    size_t t_n = (size_t)seq, c = (size_t)channels;
    MT_TRY(check_ptr(d_out, (size_t)batch * t_n * c, op, "the output gradient"));
    return check_ptr(d_wpe, t_n * c, op, "the position gradient");
}

mt_status mt_op_position_backward(mt_device *dev, const float *d_out, int batch, int seq,
                                  int channels, float *d_wpe) {
    static const char *op = "position_backward";
    MT_TRY(check_position_backward(dev, op, d_out, batch, seq, channels, d_wpe));
    if (on_cpu(dev))
        return mt_cpu_op_position_backward(d_out, batch, seq, channels, d_wpe, false);
    return CUDA_OP(dev, op,
                   mt_cuda_op_position_backward(dev, d_out, batch, seq, channels, d_wpe));
}

mt_status mt_op_layernorm_forward(mt_device *dev, const float *in, const float *gamma,
                                  const float *beta, size_t n, int channels, float *out,
                                  float *mean, float *rstd) {
    static const char *op = "layernorm_forward";
    MT_TRY(check_device(dev, op));
    if (channels <= 0 && n > 0)
        return mt_error(MT_ERR_INVALID_ARG, "%s: %d channels (the mean of none)", op, channels);
    size_t c = channels > 0 ? (size_t)channels : 0;
    MT_TRY(check_ptr(in, n * c, op, "the input"));
    MT_TRY(check_ptr(gamma, c, op, "the scale"));
    MT_TRY(check_ptr(beta, c, op, "the shift"));
    MT_TRY(check_ptr(out, n * c, op, "the output"));
    MT_TRY(check_ptr(mean, n, op, "the saved mean"));
    MT_TRY(check_ptr(rstd, n, op, "the saved rstd"));
    if (on_cpu(dev))
        return mt_cpu_op_layernorm_forward(in, gamma, beta, n, channels, out, mean, rstd);
    return CUDA_OP(dev, op,
                   mt_cuda_op_layernorm_forward(dev, in, gamma, beta, n, channels, out, mean,
                                                rstd));
}

static mt_status check_layernorm_backward(mt_device *dev, const char *op, const float *d_out,
                                         const float *in, const float *gamma, const float *mean,
                                         const float *rstd, size_t n, int channels,
                                         const float *d_in, const float *d_gamma,
                                         const float *d_beta) {
    MT_TRY(check_device(dev, op));
    if (channels <= 0 && n > 0)
        return mt_error(MT_ERR_INVALID_ARG, "%s: %d channels (the mean of none)", op, channels);
    size_t c = channels > 0 ? (size_t)channels : 0;
    MT_TRY(check_ptr(d_out, n * c, op, "the output gradient"));
    MT_TRY(check_ptr(in, n * c, op, "the input"));
    MT_TRY(check_ptr(gamma, c, op, "the scale"));
    MT_TRY(check_ptr(mean, n, op, "the saved mean"));
    MT_TRY(check_ptr(rstd, n, op, "the saved rstd"));
    MT_TRY(check_ptr(d_in, n * c, op, "the input gradient"));
    MT_TRY(check_ptr(d_gamma, c, op, "the scale gradient"));
    return check_ptr(d_beta, c, op, "the shift gradient");
}

mt_status mt_op_layernorm_backward(mt_device *dev, const float *d_out, const float *in,
                                   const float *gamma, const float *mean, const float *rstd,
                                   size_t n, int channels, float *d_in, float *d_gamma,
                                   float *d_beta) {
    static const char *op = "layernorm_backward";
    MT_TRY(check_layernorm_backward(dev, op, d_out, in, gamma, mean, rstd, n, channels, d_in,
                                    d_gamma, d_beta));
    if (on_cpu(dev))
        return mt_cpu_op_layernorm_backward(d_out, in, gamma, mean, rstd, n, channels, d_in,
                                            d_gamma, d_beta, 0);
    return CUDA_OP(dev, op,
                   mt_cuda_op_layernorm_backward(dev, d_out, in, gamma, mean, rstd, n, channels,
                                                 d_in, d_gamma, d_beta));
}

mt_status mt_op_add(mt_device *dev, const float *a, const float *b, float *out, size_t n) {
    static const char *op = "add";
    MT_TRY(check_elementwise(dev, op, n, a, "the first input", b, "the second input", out,
                             "the output"));
    if (on_cpu(dev)) return mt_cpu_op_add(a, b, out, n);
    return CUDA_OP(dev, op, mt_cuda_op_add(dev, a, b, out, n));
}

mt_status mt_op_mul(mt_device *dev, const float *a, const float *b, float *out, size_t n) {
    static const char *op = "mul";
    MT_TRY(check_elementwise(dev, op, n, a, "the first input", b, "the second input", out,
                             "the output"));
    if (on_cpu(dev)) return mt_cpu_op_mul(a, b, out, n);
    return CUDA_OP(dev, op, mt_cuda_op_mul(dev, a, b, out, n));
}

mt_status mt_op_mul_backward(mt_device *dev, const float *a, const float *b, const float *d_out,
                             float *d_a, float *d_b, size_t n) {
    static const char *op = "mul_backward";
    MT_TRY(check_device(dev, op));
    MT_TRY(check_ptr(d_out, n, op, "the output gradient"));
    /* A gradient not wanted (NULL) spares the input only it would read. */
    if (d_a) MT_TRY(check_ptr(b, n, op, "the second input (the first's gradient reads it)"));
    if (d_b) MT_TRY(check_ptr(a, n, op, "the first input (the second's gradient reads it)"));
    if (on_cpu(dev)) return mt_cpu_op_mul_backward(a, b, d_out, d_a, d_b, n);
    return CUDA_OP(dev, op, mt_cuda_op_mul_backward(dev, a, b, d_out, d_a, d_b, n));
}

mt_status mt_op_attention_forward(mt_device *dev, const float *qkv, int batch, int seq, int heads,
                                  int head_dim, float *out, float *att) {
    static const char *op = "attention_forward";
    MT_TRY(check_device(dev, op));
    MT_TRY(check_attention(op, batch, seq, heads, head_dim));
    size_t nb = (size_t)batch, t_n = (size_t)seq, nh = (size_t)heads, hd = (size_t)head_dim;
    size_t width = nh * hd, rows = nb * t_n;
    MT_TRY(check_ptr(qkv, rows * 3 * width, op, "the qkv input"));
    MT_TRY(check_ptr(out, rows * width, op, "the output"));
    MT_TRY(check_ptr(att, nb * nh * t_n * t_n, op, "the attention buffer"));
    if (on_cpu(dev))
        return mt_cpu_op_attention_forward(qkv, batch, seq, heads, head_dim, out, att);
    return CUDA_OP(dev, op,
                   mt_cuda_op_attention_forward(dev, qkv, batch, seq, heads, head_dim, out, att));
}

static mt_status attention_backward(mt_device *dev, const char *op, const float *d_out,
                                    const float *qkv, const float *att, int batch, int seq,
                                    int heads, int head_dim, float *d_qkv, unsigned overwrite) {
    MT_TRY(check_device(dev, op));
    MT_TRY(check_attention(op, batch, seq, heads, head_dim));
    size_t nb = (size_t)batch, t_n = (size_t)seq, nh = (size_t)heads, hd = (size_t)head_dim;
    size_t width = nh * hd, rows = nb * t_n;
    MT_TRY(check_ptr(d_out, rows * width, op, "the output gradient"));
    MT_TRY(check_ptr(qkv, rows * 3 * width, op, "the qkv input"));
    MT_TRY(check_ptr(att, nb * nh * t_n * t_n, op, "the attention probabilities"));
    MT_TRY(check_ptr(d_qkv, rows * 3 * width, op, "the qkv gradient"));
    if (on_cpu(dev))
        return mt_cpu_op_attention_backward(d_out, qkv, att, batch, seq, heads, head_dim, d_qkv,
                                            (overwrite & MT_OVERWRITE_D_IN) != 0);
    MT_TRY(zero_flagged(dev, op, overwrite, MT_OVERWRITE_D_IN, d_qkv, rows * 3 * width));
    return CUDA_OP(dev, op,
                   mt_cuda_op_attention_backward(dev, d_out, qkv, att, batch, seq, heads,
                                                 head_dim, d_qkv));
}

mt_status mt_op_attention_backward(mt_device *dev, const float *d_out, const float *qkv,
                                   const float *att, int batch, int seq, int heads, int head_dim,
                                   float *d_qkv) {
    return attention_backward(dev, "attention_backward", d_out, qkv, att, batch, seq, heads,
                              head_dim, d_qkv, 0u);
}

mt_status mt_op_xent_local_max(mt_device *dev, const float *logits, size_t n, int vocab_local,
                               float *row_max) {
    static const char *op = "xent_local_max";
    MT_TRY(check_device(dev, op));
    MT_TRY(check_nonneg(op, "vocabulary slice size", vocab_local));
    size_t v = (size_t)vocab_local;
    MT_TRY(check_ptr(logits, n * v, op, "the logits"));
    MT_TRY(check_ptr(row_max, n, op, "the row maxima"));
    if (on_cpu(dev)) return mt_cpu_op_xent_local_max(logits, n, vocab_local, row_max);
    return CUDA_OP(dev, op, mt_cuda_op_xent_local_max(dev, logits, n, vocab_local, row_max));
}

mt_status mt_op_xent_local_sums(mt_device *dev, const float *logits, const int *targets, size_t n,
                                int vocab_start, int vocab_local, const float *row_max,
                                float *sum_exp, float *target_logit) {
    static const char *op = "xent_local_sums";
    MT_TRY(check_device(dev, op));
    MT_TRY(check_slice(op, vocab_start, vocab_local));
    size_t v = (size_t)vocab_local;
    MT_TRY(check_ptr(logits, n * v, op, "the logits"));
    MT_TRY(check_ptr(targets, n, op, "the targets"));
    MT_TRY(check_ptr(row_max, n, op, "the row maxima"));
    MT_TRY(check_ptr(sum_exp, n, op, "the exponential sums"));
    MT_TRY(check_ptr(target_logit, n, op, "the target logits"));
    if (on_cpu(dev))
        return mt_cpu_op_xent_local_sums(logits, targets, n, vocab_start, vocab_local, row_max,
                                         sum_exp, target_logit);
    return CUDA_OP(dev, op,
                   mt_cuda_op_xent_local_sums(dev, logits, targets, n, vocab_start, vocab_local,
                                              row_max, sum_exp, target_logit));
}

mt_status mt_op_xent_loss_backward(mt_device *dev, const float *logits, const int *targets,
                                   size_t n, int vocab_start, int vocab_local,
                                   const float *row_max, const float *sum_exp,
                                   const float *target_logit, float scale, float *loss,
                                   float *d_logits) {
    static const char *op = "xent_loss_backward";
    MT_TRY(check_device(dev, op));
    MT_TRY(check_slice(op, vocab_start, vocab_local));
    size_t v = (size_t)vocab_local;
    MT_TRY(check_ptr(logits, n * v, op, "the logits"));
    MT_TRY(check_ptr(targets, n, op, "the targets"));
    MT_TRY(check_ptr(row_max, n, op, "the row maxima"));
    MT_TRY(check_ptr(sum_exp, n, op, "the exponential sums"));
    MT_TRY(check_ptr(target_logit, n, op, "the target logits"));
    MT_TRY(check_ptr(loss, n, op, "the loss output"));
    /* d_logits may be NULL: an evaluation pass wants the loss only. */
    if (on_cpu(dev))
        return mt_cpu_op_xent_loss_backward(logits, targets, n, vocab_start, vocab_local,
                                            row_max, sum_exp, target_logit, scale, loss,
                                            d_logits);
    return CUDA_OP(dev, op,
                   mt_cuda_op_xent_loss_backward(dev, logits, targets, n, vocab_start,
                                                 vocab_local, row_max, sum_exp, target_logit,
                                                 scale, loss, d_logits));
}

/* ---- backward ops that overwrite ------------------------------------------------------------- */

mt_status mt_op_linear_backward_into(mt_device *dev, const float *d_out, const float *in,
                                     const void *w, mt_dtype w_dtype, float *d_in, float *d_w,
                                     float *d_bias, int batch, int in_features, int out_features,
                                     unsigned overwrite) {
    static const char *op = "linear_backward_into";
    MT_TRY(check_float_dtype(w_dtype, op, "input"));
    MT_TRY(check_overwrite(op, overwrite,
                           MT_OVERWRITE_D_IN | MT_OVERWRITE_D_W | MT_OVERWRITE_D_BIAS));
    MT_TRY(check_linear_backward(dev, op, d_out, in, w, d_in, d_w, batch, in_features,
                                 out_features));
    /* The CPU's products take beta 0 for a flagged output (f32 and bf16 alike): no pass of
     * zeros before them. */
    if (w_dtype == MT_F32 && on_cpu(dev))
        return mt_cpu_op_linear_backward(d_out, in, w, d_in, d_w, d_bias, batch, in_features,
                                         out_features, overwrite);
    if (on_cpu(dev))
        return mt_cpu_op_linear_backward_bf16(dev, d_out, in, w, d_in, d_w, d_bias, batch,
                                              in_features, out_features, overwrite);
    size_t rows = (size_t)batch, fin = (size_t)in_features, fout = (size_t)out_features;
    MT_TRY(zero_flagged(dev, op, overwrite, MT_OVERWRITE_D_IN, d_in, rows * fin));
    MT_TRY(zero_flagged(dev, op, overwrite, MT_OVERWRITE_D_W, d_w, fout * fin));
    MT_TRY(zero_flagged(dev, op, overwrite, MT_OVERWRITE_D_BIAS, d_bias, fout));
    return mt_op_linear_backward_ex(dev, d_out, in, w, w_dtype, d_in, d_w, d_bias, batch,
                                    in_features, out_features);
}

mt_status mt_op_layernorm_backward_into(mt_device *dev, const float *d_out, const float *in,
                                        const float *gamma, const float *mean, const float *rstd,
                                        size_t n, int channels, float *d_in, float *d_gamma,
                                        float *d_beta, unsigned overwrite) {
    static const char *op = "layernorm_backward_into";
    MT_TRY(check_overwrite(op, overwrite,
                           MT_OVERWRITE_D_IN | MT_OVERWRITE_D_W | MT_OVERWRITE_D_BIAS));
    MT_TRY(check_layernorm_backward(dev, op, d_out, in, gamma, mean, rstd, n, channels, d_in,
                                    d_gamma, d_beta));
    if (!on_cpu(dev)) {
        size_t c = channels > 0 ? (size_t)channels : 0;
        MT_TRY(zero_flagged(dev, op, overwrite, MT_OVERWRITE_D_IN, d_in, n * c));
        MT_TRY(zero_flagged(dev, op, overwrite, MT_OVERWRITE_D_W, d_gamma, c));
        MT_TRY(zero_flagged(dev, op, overwrite, MT_OVERWRITE_D_BIAS, d_beta, c));
        return mt_op_layernorm_backward(dev, d_out, in, gamma, mean, rstd, n, channels, d_in,
                                        d_gamma, d_beta);
    }
    return mt_cpu_op_layernorm_backward(d_out, in, gamma, mean, rstd, n, channels, d_in, d_gamma,
                                        d_beta, overwrite);
}

mt_status mt_op_position_backward_into(mt_device *dev, const float *d_out, int batch, int seq,
                                       int channels, float *d_wpe, unsigned overwrite) {
    static const char *op = "position_backward_into";
    MT_TRY(check_overwrite(op, overwrite, MT_OVERWRITE_D_W));
    MT_TRY(check_position_backward(dev, op, d_out, batch, seq, channels, d_wpe));
    if (!on_cpu(dev)) {
        MT_TRY(zero_flagged(dev, op, overwrite, MT_OVERWRITE_D_W, d_wpe,
                            (size_t)seq * (size_t)channels));
        return mt_op_position_backward(dev, d_out, batch, seq, channels, d_wpe);
    }
    return mt_cpu_op_position_backward(d_out, batch, seq, channels, d_wpe, overwrite != 0);
}

mt_status mt_op_gelu_backward_into(mt_device *dev, const float *in, const float *d_out,
                                   float *d_in, size_t n, unsigned overwrite) {
    static const char *op = "gelu_backward_into";
    MT_TRY(check_overwrite(op, overwrite, MT_OVERWRITE_D_IN));
    if (overwrite && !on_cpu(dev)) {
        MT_TRY(check_elementwise(dev, op, n, in, "the input", d_out, "the output gradient", d_in,
                                 "the input gradient"));
        MT_TRY(zero_flagged(dev, op, overwrite, MT_OVERWRITE_D_IN, d_in, n));
    }
    return activation_backward(dev, op, in, "the input", d_out, d_in, n,
                               overwrite ? cpu_gelu_backward_overwrite : cpu_gelu_backward_add,
                               CUDA_IMPL(mt_cuda_op_gelu_backward));
}

mt_status mt_op_attention_backward_into(mt_device *dev, const float *d_out, const float *qkv,
                                        const float *att, int batch, int seq, int heads,
                                        int head_dim, float *d_qkv, unsigned overwrite) {
    static const char *op = "attention_backward_into";
    MT_TRY(check_overwrite(op, overwrite, MT_OVERWRITE_D_IN));
    return attention_backward(dev, op, d_out, qkv, att, batch, seq, heads, head_dim, d_qkv,
                              overwrite);
}
