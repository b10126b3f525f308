/* Elementwise ops on a CUDA device: ReLU, GELU, tanh, sigmoid, SiLU, the residual add, the
 * product, the MSE loss and AdamW. Each is a grid-stride loop over n in the formulas of the CPU
 * versions (core/cpu/ops_cpu.c, core/cpu/ops_gelu.c; tanh, sigmoid, SiLU and the product share
 * theirs with core/cpu/ops_elementwise.c through core/ops_elementwise.h), so the two agree to
 * float rounding (GELU: the CPU's vectorised tanh is within a few ulps of tanhf,
 * docs/cpu-kernels.md). */
#include "core/cuda/ops_cuda.h"
#include "core/ops_elementwise.h"

/* Launches kernel over n items with args on dev's GPU (nothing to do for n = 0). */
template <typename... Params, typename... Args>
static mt_status launch_elementwise(mt_device *dev, const char *op, size_t n,
                                    void (*kernel)(Params...), Args... args) {
    if (n == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    MT_CUDA_LAUNCH(kernel, n, args...);
    return mt_cuda_ops_launched(dev, op);
}

/* ---- ReLU, GELU, add ------------------------------------------------------------------------- */

__global__ void relu_forward_kernel(const float *in, float *out, size_t n) {
    MT_GRID_STRIDE(i, n) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

__global__ void relu_backward_kernel(const float *out, const float *d_out, float *d_in, size_t n) {
    MT_GRID_STRIDE(i, n) d_in[i] += out[i] > 0.0f ? d_out[i] : 0.0f;
}

/* sqrt(2 / pi) and the cubic coefficient of GPT-2's tanh GELU. */
#define GELU_K 0.7978845608028654f
#define GELU_C 0.044715f

__global__ void gelu_forward_kernel(const float *in, float *out, size_t n) {
    MT_GRID_STRIDE(i, n) {
        float x = in[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_C * x * x * x)));
    }
}

__global__ void gelu_backward_kernel(const float *in, const float *d_out, float *d_in, size_t n) {
    MT_GRID_STRIDE(i, n) {
        float x = in[i];
        float th = tanhf(GELU_K * (x + GELU_C * x * x * x));
        /* sech^2 as 1 - tanh^2: cosh overflows for large |x|, tanh saturates cleanly. */
        float sech2 = 1.0f - th * th;
        float grad =
            0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
        d_in[i] += grad * d_out[i];
    }
}

/* out may alias a or b: each element is read before it is written, by the same thread. */
__global__ void add_kernel(const float *a, const float *b, float *out, size_t n) {
    MT_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

extern "C" mt_status mt_cuda_op_relu_forward(mt_device *dev, const float *in, float *out,
                                             size_t n) {
    return launch_elementwise(dev, "relu_forward", n, relu_forward_kernel, in, out, n);
}

extern "C" mt_status mt_cuda_op_relu_backward(mt_device *dev, const float *out, const float *d_out,
                                              float *d_in, size_t n) {
    return launch_elementwise(dev, "relu_backward", n, relu_backward_kernel, out, d_out, d_in, n);
}

extern "C" mt_status mt_cuda_op_gelu_forward(mt_device *dev, const float *in, float *out,
                                             size_t n) {
    return launch_elementwise(dev, "gelu_forward", n, gelu_forward_kernel, in, out, n);
}

extern "C" mt_status mt_cuda_op_gelu_backward(mt_device *dev, const float *in, const float *d_out,
                                              float *d_in, size_t n) {
    return launch_elementwise(dev, "gelu_backward", n, gelu_backward_kernel, in, d_out, d_in, n);
}

extern "C" mt_status mt_cuda_op_add(mt_device *dev, const float *a, const float *b, float *out,
                                    size_t n) {
    return launch_elementwise(dev, "add", n, add_kernel, a, b, out, n);
}

/* ---- tanh, sigmoid, SiLU, product ------------------------------------------------------------ */

/* One kernel template per shape, instantiated with each formula of core/ops_elementwise.h (a
 * function known at compile time: inlined into the kernel, no call through a pointer). */

/* out[i] = F(in[i]); out may be in. */
template <float (*F)(float)> __global__ void map_kernel(const float *in, float *out, size_t n) {
    MT_GRID_STRIDE(i, n) out[i] = F(in[i]);
}

/* d_in[i] += GRAD(saved[i]) * d_out[i], saved being the forward output or input. */
template <float (*GRAD)(float)>
__global__ void map_grad_kernel(const float *saved, const float *d_out, float *d_in, size_t n) {
    MT_GRID_STRIDE(i, n) d_in[i] += GRAD(saved[i]) * d_out[i];
}

/* out may alias a or b: each element is read before it is written, by the same thread. */
__global__ void mul_kernel(const float *a, const float *b, float *out, size_t n) {
    MT_GRID_STRIDE(i, n) out[i] = a[i] * b[i];
}

__global__ void mul_backward_kernel(const float *a, const float *b, const float *d_out, float *d_a,
                                    float *d_b, size_t n) {
    MT_GRID_STRIDE(i, n) mt_mul_backward_at(a, b, d_out, d_a, d_b, i);
}

extern "C" mt_status mt_cuda_op_tanh_forward(mt_device *dev, const float *in, float *out,
                                             size_t n) {
    return launch_elementwise(dev, "tanh_forward", n, map_kernel<mt_tanh_value>, in, out, n);
}

extern "C" mt_status mt_cuda_op_tanh_backward(mt_device *dev, const float *out, const float *d_out,
                                              float *d_in, size_t n) {
    return launch_elementwise(dev, "tanh_backward", n, map_grad_kernel<mt_tanh_grad>, out, d_out,
                              d_in, n);
}

extern "C" mt_status mt_cuda_op_sigmoid_forward(mt_device *dev, const float *in, float *out,
                                                size_t n) {
    return launch_elementwise(dev, "sigmoid_forward", n, map_kernel<mt_sigmoid_value>, in, out,
                              n);
}

extern "C" mt_status mt_cuda_op_sigmoid_backward(mt_device *dev, const float *out,
                                                 const float *d_out, float *d_in, size_t n) {
    return launch_elementwise(dev, "sigmoid_backward", n, map_grad_kernel<mt_sigmoid_grad>,
                              out, d_out, d_in, n);
}

extern "C" mt_status mt_cuda_op_silu_forward(mt_device *dev, const float *in, float *out,
                                             size_t n) {
    return launch_elementwise(dev, "silu_forward", n, map_kernel<mt_silu_value>, in, out, n);
}

extern "C" mt_status mt_cuda_op_silu_backward(mt_device *dev, const float *in, const float *d_out,
                                              float *d_in, size_t n) {
    return launch_elementwise(dev, "silu_backward", n, map_grad_kernel<mt_silu_grad>, in, d_out,
                              d_in, n);
}

extern "C" mt_status mt_cuda_op_mul(mt_device *dev, const float *a, const float *b, float *out,
                                    size_t n) {
    return launch_elementwise(dev, "mul", n, mul_kernel, a, b, out, n);
}

extern "C" mt_status mt_cuda_op_mul_backward(mt_device *dev, const float *a, const float *b,
                                             const float *d_out, float *d_a, float *d_b,
                                             size_t n) {
    if (!d_a && !d_b) return MT_OK; /* no gradient wanted: no kernel */
    return launch_elementwise(dev, "mul_backward", n, mul_backward_kernel, a, b, d_out, d_a, d_b,
                              n);
}

/* ---- MSE ------------------------------------------------------------------------------------- */

/* One block sums every squared difference in double (as the CPU does: the loss is compared across
 * rank counts) and writes the mean. One block keeps the order fixed, so the result is the same on
 * every run; the MSE heads are small. */
__global__ void mse_forward_kernel(const float *pred, const float *target, size_t n, float *loss) {
    double s = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        double d = (double)pred[i] - (double)target[i];
        s += d * d;
    }
    s = mt_block_sum<double>(s);
    if (threadIdx.x == 0) *loss = (float)(s / (double)n);
}

__global__ void mse_backward_kernel(const float *pred, const float *target, size_t n, float k,
                                    float *d_pred) {
    MT_GRID_STRIDE(i, n) d_pred[i] += k * (pred[i] - target[i]);
}

extern "C" mt_status mt_cuda_op_mse_forward(mt_device *dev, const float *pred, const float *target,
                                            size_t n, float *loss) {
    static const char *op = "mse_forward";
    MT_TRY(mt_cuda_ops_select(dev, op));
    float *d_loss = NULL;
    MT_TRY(mt_device_alloc(dev, sizeof(float), MT_MEM_OTHER, (void **)&d_loss));
    mse_forward_kernel<<<1, 1024>>>(pred, target, n, d_loss);
    mt_status st = mt_cuda_ops_launched(dev, op);
    if (st == MT_OK) {
        /* cudaMemcpyDefault: the callers pass a host float, a device one works as well. The copy
         * waits for the kernel (same default stream). */
        cudaError_t err = cudaMemcpy(loss, d_loss, sizeof(float), cudaMemcpyDefault);
        if (err != cudaSuccess) {
            (void)cudaGetLastError(); /* not the next op's error */
            st = mt_error(MT_ERR_SYSTEM, "%s on %s: reading the loss back failed: %s", op,
                          mt_device_name(dev), cudaGetErrorString(err));
        }
    }
    mt_device_free(dev, d_loss);
    return st;
}

extern "C" mt_status mt_cuda_op_mse_backward(mt_device *dev, const float *pred,
                                             const float *target, size_t n, float scale,
                                             float *d_pred) {
    static const char *op = "mse_backward";
    MT_TRY(mt_cuda_ops_select(dev, op));
    float k = (float)(2.0 * (double)scale / (double)n);
    MT_CUDA_LAUNCH(mse_backward_kernel, n, pred, target, n, k, d_pred);
    return mt_cuda_ops_launched(dev, op);
}

/* ---- AdamW ----------------------------------------------------------------------------------- */

__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n,
                             float lr, float beta1, float beta2, float eps, float c1, float c2,
                             float decay) {
    MT_GRID_STRIDE(i, n) {
        float g = grad[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = param[i];
        param[i] = p - lr * (mi * c1) / (sqrtf(vi * c2) + eps) - decay * p;
    }
}

extern "C" mt_status mt_cuda_op_adamw(mt_device *dev, float *param, const float *grad, float *m,
                                      float *v, size_t n, long t, float lr, float beta1,
                                      float beta2, float eps, float weight_decay) {
    static const char *op = "adamw";
    if (n == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    /* The bias corrections on the host in double, exactly as the CPU computes them. */
    float c1 = (float)(1.0 / (1.0 - pow((double)beta1, (double)t)));
    float c2 = (float)(1.0 / (1.0 - pow((double)beta2, (double)t)));
    MT_CUDA_LAUNCH(adamw_kernel, n, param, grad, m, v, n, lr, beta1, beta2, eps, c1, c2,
                   lr * weight_decay);
    return mt_cuda_ops_launched(dev, op);
}
