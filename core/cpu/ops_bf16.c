/* bf16 matrix products on the CPU device (mt_op_gemm_ex, mt_op_linear_*_ex with bf16), on one of
 * two paths chosen once per process (core/cpu/bf16_gemm_path.h):
 *
 * - oneDNN: bf16 x bf16 products accumulated in f32 (core/cpu/gemm_dnnl.c), on CPUs with bf16
 *   instructions. The f32 operands that autocast would round (the linear's input, the output
 *   gradient) are rounded to bf16 copies first (round to nearest even, core/bf16_inline.h).
 * - f32: OpenBLAS has no bf16 GEMM we can rely on, so the bf16 operands are widened to f32 in
 *   scratch memory and multiplied with sgemm; the operands autocast would round are rounded to
 *   bf16 and widened back.
 *
 * Both compute what cuBLAS GemmEx with bf16 inputs and CUBLAS_COMPUTE_32F computes, up to
 * summation order (widening is exact, both accumulate in f32), so they differ from each other in
 * the last bits only. Scratch is charged to activations on dev and freed before returning
 * (models/gpt_memory.c replays it). core/ops.c has checked the arguments. */
#include "core/bf16_inline.h"
#include "core/cpu/bf16_gemm_path.h"
#include "core/cpu/gemm_dnnl.h"
#include "core/cpu/ops_cpu.h"
#include "core/error.h"

#include <stdint.h>

/* n values of elem_size bytes of scratch on dev (at least one, so that empty operands still get a
 * pointer). */
static mt_status scratch(mt_device *dev, const char *op, const char *what, size_t n,
                         size_t elem_size, void **out) {
    *out = NULL;
    mt_status st = mt_device_alloc(dev, (n ? n : 1) * elem_size, MT_MEM_ACTIVATIONS, out);
    if (st != MT_OK)
        return mt_error_wrap(st, "%s (bf16): scratch for %s (%zu values)", op, what, n);
    return MT_OK;
}

/* out = the n bf16 values of src as f32 (exact). */
static mt_status widened(mt_device *dev, const char *op, const char *what, const void *src,
                         size_t n, float **out) {
    MT_TRY(scratch(dev, op, what, n, sizeof(float), (void **)out));
    mt_bf16_to_f32_array(src, *out, n);
    return MT_OK;
}

/* out = the n f32 values of src rounded to bf16, as f32: what a bf16 copy would hold. */
static mt_status rounded(mt_device *dev, const char *op, const char *what, const float *src,
                         size_t n, float **out) {
    MT_TRY(scratch(dev, op, what, n, sizeof(float), (void **)out));
    float *d = *out;
    for (size_t i = 0; i < n; i++) d[i] = mt_bf16_widen(mt_bf16_round(src[i]));
    return MT_OK;
}

/* out = the n f32 values of src rounded to bf16 (the oneDNN path's operand), over the pool. */
static mt_status narrowed(mt_device *dev, const char *op, const char *what, const float *src,
                          size_t n, uint16_t **out) {
    MT_TRY(scratch(dev, op, what, n, sizeof(uint16_t), (void **)out));
    return mt_cpu_op_cast(src, MT_F32, *out, MT_BF16, n);
}

static mt_status path_of(const char *op, mt_bf16_gemm_path *path) {
    mt_status st = mt_cpu_bf16_gemm_path(path, true);
    return st == MT_OK ? MT_OK : mt_error_wrap(st, "%s (bf16)", op);
}

mt_status mt_cpu_op_gemm_bf16(mt_device *dev, bool trans_a, bool trans_b, int m, int n, int k,
                              float alpha, const void *a, const void *b, float beta, float *c) {
    static const char *op = "gemm_ex";
    /* Nothing to widen when the product is empty: the f32 gemm applies beta alone. */
    if (m == 0 || n == 0 || k == 0)
        return mt_cpu_op_gemm(trans_a, trans_b, m, n, k, alpha, NULL, NULL, beta, c);
    mt_bf16_gemm_path path;
    MT_TRY(path_of(op, &path));
    if (path == MT_BF16_GEMM_ONEDNN)
        return mt_cpu_dnnl_gemm_bf16(op, trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
    float *fa = NULL, *fb = NULL;
    mt_status st = widened(dev, op, "A", a, (size_t)m * (size_t)k, &fa);
    if (st == MT_OK) st = widened(dev, op, "B", b, (size_t)k * (size_t)n, &fb);
    if (st == MT_OK) st = mt_cpu_op_gemm(trans_a, trans_b, m, n, k, alpha, fa, fb, beta, c);
    mt_device_free(dev, fa);
    mt_device_free(dev, fb);
    return st;
}

/* oneDNN: out = bias rows + round(in) W^T. */
static mt_status linear_forward_dnnl(mt_device *dev, const char *op, const float *in,
                                     const uint16_t *w, const float *bias, float *out, int batch,
                                     int in_features, int out_features) {
    size_t rows = (size_t)batch, fin = (size_t)in_features;
    uint16_t *in_r = NULL;
    mt_status st = narrowed(dev, op, "the rounded input", in, rows * fin, &in_r);
    /* As the f32 linear: start from the bias rows (or zeros) and add the product onto them. */
    if (st == MT_OK) st = mt_cpu_bias_rows(bias, out, rows, (size_t)out_features);
    if (st == MT_OK && batch && out_features && in_features)
        st = mt_cpu_dnnl_gemm_bf16(op, false, true, batch, out_features, in_features, 1.0f, in_r,
                                   w, 1.0f, out);
    mt_device_free(dev, in_r);
    return st;
}

mt_status mt_cpu_op_linear_forward_bf16(mt_device *dev, const float *in, const void *w,
                                        const float *bias, float *out, int batch,
                                        int in_features, int out_features) {
    static const char *op = "linear_forward_ex";
    mt_bf16_gemm_path path;
    MT_TRY(path_of(op, &path));
    if (path == MT_BF16_GEMM_ONEDNN)
        return linear_forward_dnnl(dev, op, in, w, bias, out, batch, in_features, out_features);
    size_t rows = (size_t)batch, fin = (size_t)in_features, fout = (size_t)out_features;
    float *fin_r = NULL, *fw = NULL;
    mt_status st = rounded(dev, op, "the rounded input", in, rows * fin, &fin_r);
    if (st == MT_OK) st = widened(dev, op, "the weight", w, fout * fin, &fw);
    if (st == MT_OK)
        st = mt_cpu_op_linear_forward(fin_r, fw, bias, out, batch, in_features, out_features);
    mt_device_free(dev, fin_r);
    mt_device_free(dev, fw);
    return st;
}

/* beta for an output of the linear backward: 0 where overwrite flags it (its old contents are
 * never read: oneDNN without its sum post-op, sgemm after writing zeros), else 1 (add). */
static float beta_of(unsigned overwrite, unsigned flag) {
    return overwrite & flag ? 0.0f : 1.0f;
}

/* C = op(A) op(B) + beta C on oneDNN; an empty product (k == 0) applies beta alone, so that an
 * overwritten output of no rows' product still comes out 0. */
static mt_status dnnl_product(const char *op, bool trans_a, bool trans_b, int m, int n, int k,
                              const uint16_t *a, const uint16_t *b, float beta, float *c) {
    if (m == 0 || n == 0 || k == 0)
        return mt_cpu_op_gemm(trans_a, trans_b, m, n, k, 1.0f, NULL, NULL, beta, c);
    return mt_cpu_dnnl_gemm_bf16(op, trans_a, trans_b, m, n, k, 1.0f, a, b, beta, c);
}

/* oneDNN: d_in (+)= round(g) W, d_w (+)= round(g)^T round(in), "=" for the outputs overwrite
 * flags. */
static mt_status linear_backward_dnnl(mt_device *dev, const char *op, const float *d_out,
                                      const float *in, const uint16_t *w, float *d_in, float *d_w,
                                      int batch, int in_features, int out_features,
                                      unsigned overwrite) {
    size_t rows = (size_t)batch, fin = (size_t)in_features, fout = (size_t)out_features;
    uint16_t *g_r = NULL, *in_r = NULL;
    mt_status st = narrowed(dev, op, "the rounded output gradient", d_out, rows * fout, &g_r);
    if (st == MT_OK) st = narrowed(dev, op, "the rounded input", in, rows * fin, &in_r);
    if (st == MT_OK && d_in)
        st = dnnl_product(op, false, false, batch, in_features, out_features, g_r, w,
                          beta_of(overwrite, MT_OVERWRITE_D_IN), d_in);
    if (st == MT_OK)
        st = dnnl_product(op, true, false, out_features, in_features, batch, g_r, in_r,
                          beta_of(overwrite, MT_OVERWRITE_D_W), d_w);
    mt_device_free(dev, g_r);
    mt_device_free(dev, in_r);
    return st;
}

mt_status mt_cpu_op_linear_backward_bf16(mt_device *dev, const float *d_out, const float *in,
                                         const void *w, float *d_in, float *d_w, float *d_bias,
                                         int batch, int in_features, int out_features,
                                         unsigned overwrite) {
    static const char *op = "linear_backward_ex";
    size_t rows = (size_t)batch, fin = (size_t)in_features, fout = (size_t)out_features;
    mt_bf16_gemm_path path;
    MT_TRY(path_of(op, &path));
    mt_status st = MT_OK;
    if (path == MT_BF16_GEMM_ONEDNN) {
        st = linear_backward_dnnl(dev, op, d_out, in, w, d_in, d_w, batch, in_features,
                                  out_features, overwrite);
    } else {
        float *g_r = NULL, *in_r = NULL, *fw = NULL;
        st = rounded(dev, op, "the rounded output gradient", d_out, rows * fout, &g_r);
        if (st == MT_OK) st = rounded(dev, op, "the rounded input", in, rows * fin, &in_r);
        if (st == MT_OK && d_in) st = widened(dev, op, "the weight", w, fout * fin, &fw);
        if (st == MT_OK && d_in)
            st = mt_cpu_op_gemm(false, false, batch, in_features, out_features, 1.0f, g_r, fw,
                                beta_of(overwrite, MT_OVERWRITE_D_IN), d_in);
        if (st == MT_OK)
            st = mt_cpu_op_gemm(true, false, out_features, in_features, batch, 1.0f, g_r, in_r,
                                beta_of(overwrite, MT_OVERWRITE_D_W), d_w);
        mt_device_free(dev, g_r);
        mt_device_free(dev, in_r);
        mt_device_free(dev, fw);
    }
    /* The bias gradient is a plain f32 sum of the unrounded gradient: no product, nothing for
     * autocast to round. */
    if (st == MT_OK && d_bias)
        st = mt_cpu_column_sums(d_out, rows, fout, d_bias, (overwrite & MT_OVERWRITE_D_BIAS) != 0);
    return st;
}
