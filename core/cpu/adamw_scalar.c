/* The scalar AdamW kernel: the reference every vector path must match bit for bit, and their
 * tail. The expression is mt_op_adamw's since the op exists (and core/cuda's kernel's); compiled
 * with -ffp-contract=off (CMakeLists.txt) so that no multiply-add is fused on a CPU with FMA. */
#include "core/cpu/adamw_host.h"

#include <math.h>

void mt_adamw_kernel_scalar(const mt_adamw_coeffs *k, float *param, const float *grad, float *m,
                            float *v, size_t n) {
    const float lr = k->lr, beta1 = k->beta1, beta2 = k->beta2, eps = k->eps;
    const float c1 = k->c1, c2 = k->c2, decay = k->decay, grad_scale = k->grad_scale;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = param[i];
        param[i] = p - lr * (mi * c1) / (sqrtf(vi * c2) + eps) - decay * p;
    }
}
