/* Internal: the body of the vector AdamW kernels, one text for every width, so that the AVX2 and
 * AVX-512 paths cannot drift apart. The including file defines ADAMW_VEC (the vector type),
 * ADAMW_OP(name) (its intrinsic, e.g. _mm256_##name##_ps), ADAMW_LANES and ADAMW_KERNEL (the
 * function's name), and is compiled with -ffp-contract=off and its instruction set
 * (CMakeLists.txt). Each line is one rounding of the scalar kernel, in its order: separate mul
 * and add (no FMA), sqrt then div (no rsqrt), so that the lanes hold the scalar kernel's bits. */
void ADAMW_KERNEL(const mt_adamw_coeffs *k, float *param, const float *grad, float *m, float *v,
                  size_t n) {
    const ADAMW_VEC lr = ADAMW_OP(set1)(k->lr), beta1 = ADAMW_OP(set1)(k->beta1);
    const ADAMW_VEC beta2 = ADAMW_OP(set1)(k->beta2), eps = ADAMW_OP(set1)(k->eps);
    const ADAMW_VEC omb1 = ADAMW_OP(set1)(k->one_minus_beta1);
    const ADAMW_VEC omb2 = ADAMW_OP(set1)(k->one_minus_beta2);
    const ADAMW_VEC c1 = ADAMW_OP(set1)(k->c1), c2 = ADAMW_OP(set1)(k->c2);
    const ADAMW_VEC decay = ADAMW_OP(set1)(k->decay);
    const ADAMW_VEC grad_scale = ADAMW_OP(set1)(k->grad_scale);
    size_t i = 0;
    for (; i + ADAMW_LANES <= n; i += ADAMW_LANES) {
        ADAMW_VEC g = ADAMW_OP(mul)(ADAMW_OP(loadu)(grad + i), grad_scale);
        /* mi = beta1 * m + (1 - beta1) * g */
        ADAMW_VEC mi = ADAMW_OP(add)(ADAMW_OP(mul)(beta1, ADAMW_OP(loadu)(m + i)),
                                     ADAMW_OP(mul)(omb1, g));
        /* vi = beta2 * v + ((1 - beta2) * g) * g */
        ADAMW_VEC vi = ADAMW_OP(add)(ADAMW_OP(mul)(beta2, ADAMW_OP(loadu)(v + i)),
                                     ADAMW_OP(mul)(ADAMW_OP(mul)(omb2, g), g));
        ADAMW_OP(storeu)(m + i, mi);
        ADAMW_OP(storeu)(v + i, vi);
        ADAMW_VEC p = ADAMW_OP(loadu)(param + i);
        /* (p - (lr * (mi * c1)) / (sqrt(vi * c2) + eps)) - decay * p */
        ADAMW_VEC step = ADAMW_OP(div)(ADAMW_OP(mul)(lr, ADAMW_OP(mul)(mi, c1)),
                                       ADAMW_OP(add)(ADAMW_OP(sqrt)(ADAMW_OP(mul)(vi, c2)), eps));
        ADAMW_OP(storeu)(param + i,
                         ADAMW_OP(sub)(ADAMW_OP(sub)(p, step), ADAMW_OP(mul)(decay, p)));
    }
    mt_adamw_kernel_scalar(k, param + i, grad + i, m + i, v + i, n - i);
}
