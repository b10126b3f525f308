/* Elementwise activations and the elementwise product on the CPU device (mt_op_tanh_*,
 * mt_op_sigmoid_*, mt_op_silu_*, mt_op_mul*); the formulas are core/ops_elementwise.h's, shared
 * with the CUDA kernels. core/ops.c has checked the arguments. */
#include "core/cpu/ops_cpu.h"
#include "core/ops_elementwise.h"

/* out[i] = f(in[i]); out may be in. */
static mt_status map(const float *in, float *out, size_t n, float (*f)(float)) {
    for (size_t i = 0; i < n; i++) out[i] = f(in[i]);
    return MT_OK;
}

/* d_in[i] += grad(saved[i]) * d_out[i], saved being the forward output or input. */
static mt_status map_grad(const float *saved, const float *d_out, float *d_in, size_t n,
                          float (*grad)(float)) {
    for (size_t i = 0; i < n; i++) d_in[i] += grad(saved[i]) * d_out[i];
    return MT_OK;
}

mt_status mt_cpu_op_tanh_forward(const float *in, float *out, size_t n) {
    return map(in, out, n, mt_tanh_value);
}

mt_status mt_cpu_op_tanh_backward(const float *out, const float *d_out, float *d_in, size_t n) {
    return map_grad(out, d_out, d_in, n, mt_tanh_grad);
}

mt_status mt_cpu_op_sigmoid_forward(const float *in, float *out, size_t n) {
    return map(in, out, n, mt_sigmoid_value);
}

mt_status mt_cpu_op_sigmoid_backward(const float *out, const float *d_out, float *d_in,
                                     size_t n) {
    return map_grad(out, d_out, d_in, n, mt_sigmoid_grad);
}

mt_status mt_cpu_op_silu_forward(const float *in, float *out, size_t n) {
    return map(in, out, n, mt_silu_value);
}

mt_status mt_cpu_op_silu_backward(const float *in, const float *d_out, float *d_in, size_t n) {
    return map_grad(in, d_out, d_in, n, mt_silu_grad);
}

mt_status mt_cpu_op_mul(const float *a, const float *b, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] * b[i];
    return MT_OK;
}

mt_status mt_cpu_op_mul_backward(const float *a, const float *b, const float *d_out, float *d_a,
                                 float *d_b, size_t n) {
    for (size_t i = 0; i < n; i++) mt_mul_backward_at(a, b, d_out, d_a, d_b, i);
    return MT_OK;
}
