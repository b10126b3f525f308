/* Internal: the formulas of the elementwise activations (include/meshtrain/ops.h), written once
 * for both implementations: core/cpu/ops_elementwise.c calls them from C loops and
 * core/cuda/ops_elementwise.cu from kernels (host and device functions under nvcc), so the CPU and
 * the GPU compute the same expressions and differ only in their libm's last bits. Each *_grad
 * takes what the op's backward is given (the forward output or input) and returns f'. */
#ifndef MT_CORE_OPS_ELEMENTWISE_H
#define MT_CORE_OPS_ELEMENTWISE_H

#include <math.h>
#include <stddef.h>

#ifdef __CUDACC__
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

/* 1 / (1 + e^-x): e^-x overflows to inf for x below about -88, giving exactly 0, never NaN. */
MT_HOST_DEVICE static inline float mt_sigmoid_value(float x) { return 1.0f / (1.0f + expf(-x)); }

MT_HOST_DEVICE static inline float mt_tanh_value(float x) { return tanhf(x); }

/* tanh' from y = tanh(x): 1 - y^2. */
MT_HOST_DEVICE static inline float mt_tanh_grad(float y) { return 1.0f - y * y; }

/* sigmoid' from y = sigmoid(x): y (1 - y). */
MT_HOST_DEVICE static inline float mt_sigmoid_grad(float y) { return y * (1.0f - y); }

MT_HOST_DEVICE static inline float mt_silu_value(float x) { return x * mt_sigmoid_value(x); }

/* silu' from x: s + x s (1 - s), written s (1 + x (1 - s)), s = sigmoid(x). */
MT_HOST_DEVICE static inline float mt_silu_grad(float x) {
    float s = mt_sigmoid_value(x);
    return s * (1.0f + x * (1.0f - s));
}

/* Element i of the product's backward: d_a[i] += d_out[i] b[i], d_b[i] += d_out[i] a[i], either
 * gradient absent (NULL). The inputs are read before either gradient is written, so any buffers
 * may alias; d_a == d_b accumulates both terms. */
MT_HOST_DEVICE static inline void mt_mul_backward_at(const float *a, const float *b,
                                                     const float *d_out, float *d_a, float *d_b,
                                                     size_t i) {
    float g = d_out[i];
    float ai = d_b ? a[i] : 0.0f, bi = d_a ? b[i] : 0.0f;
    if (d_a) d_a[i] += g * bi;
    if (d_b) d_b[i] += g * ai;
}

#endif
