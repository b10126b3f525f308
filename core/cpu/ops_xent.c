/* The vocabulary-parallel cross-entropy on the CPU device (include/meshtrain/ops.h, "GPT ops"),
 * split over the rank's pool by rows: every row's sums run in one thread, in double, in
 * vocabulary order (the same bits with any pool; the tp tests compare them across slice
 * splits), over exponentials from the vector exp of core/cpu/gelu_vec.h (within 2 ulp). The
 * values are checked in the calling thread first, so that an error names the first bad row
 * whatever the split. */
#include "core/cpu/gelu_kernels.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/ops_gpt_internal.h"
#include "core/cpu/parallel.h"
#include "core/error.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Floats of a row's exponentials at a time (on the stack). */
enum { XENT_BLOCK = 512 };

typedef struct xent_job {
    const float *logits, *row_max, *sum_exp, *target_logit;
    const int *targets;
    size_t v;
    int vocab_start, vocab_local;
    float scale;
    mt_exp_shift_fn exp_shift;
    float *out_max, *out_sum, *out_target, *loss, *d_logits;
} xent_job;

/* The row maximum's running maxima: XENT_MAX_VECS independent vectors of 4 lanes (the baseline
 * SSE width, which every x86-64 runs; a wider GCC vector type is split into scalar code there),
 * so that the compare-and-select of one element does not wait for the previous one's (the loop
 * is a chain of maxss, about one element a cycle). */
enum { XENT_MAX_WIDTH = 4, XENT_MAX_VECS = 4, XENT_MAX_LANES = XENT_MAX_WIDTH * XENT_MAX_VECS };
typedef float xent_vf __attribute__((vector_size(XENT_MAX_WIDTH * sizeof(float))));
typedef int32_t xent_vi __attribute__((vector_size(XENT_MAX_WIDTH * sizeof(float))));

/* The loop's rule, from mx = -inf in element order: mx = l[k] > mx ? l[k] : mx. So NaNs are
 * skipped (a compare with NaN is false), a row of NaNs or none gives -inf, and of several
 * elements equal to the maximum the first is kept; equal floats have equal bits except +0 and
 * -0, so only a zero maximum depends on the order. Each lane keeps the rule over its elements
 * and the lanes are combined by it, which gives the loop's bits for any other maximum; a row
 * whose maximum is a zero runs the loop again for its sign. */
static float row_max_loop(const float *l, size_t v) {
    float mx = -INFINITY;
    for (size_t k = 0; k < v; k++)
        if (l[k] > mx) mx = l[k];
    return mx;
}

static float xent_row_max(const float *l, size_t v) {
    size_t k = 0;
    float mx = -INFINITY;
    if (v >= XENT_MAX_LANES) {
        xent_vf m[XENT_MAX_VECS];
        for (int q = 0; q < XENT_MAX_VECS; q++) m[q] = (xent_vf){0} - INFINITY;
        for (; k + XENT_MAX_LANES <= v; k += XENT_MAX_LANES)
            for (int q = 0; q < XENT_MAX_VECS; q++) {
                xent_vf x;
                memcpy(&x, l + k + (size_t)q * XENT_MAX_WIDTH, sizeof x);
                xent_vi gt = x > m[q];
                m[q] = (xent_vf)(((xent_vi)x & gt) | ((xent_vi)m[q] & ~gt));
            }
        for (int q = 0; q < XENT_MAX_VECS; q++)
            for (int lane = 0; lane < XENT_MAX_WIDTH; lane++)
                if (m[q][lane] > mx) mx = m[q][lane];
    }
    for (; k < v; k++)
        if (l[k] > mx) mx = l[k];
    return mx == 0.0f ? row_max_loop(l, v) : mx;
}

static void xent_max_rows(void *ctx, size_t chunk, size_t begin, size_t end) {
    const xent_job *j = ctx;
    /* An empty slice gives -inf, the identity of the MAX all-reduce. */
    for (size_t i = begin; i < end; i++) j->out_max[i] = xent_row_max(j->logits + i * j->v, j->v);
}

mt_status mt_cpu_op_xent_local_max(const float *logits, size_t n, int vocab_local,
                                   float *row_max) {
    xent_job job = {.logits = logits, .v = (size_t)vocab_local, .out_max = row_max};
    return mt_cpu_parallel("xent_local_max", n, mt_cpu_row_grain(job.v), xent_max_rows, &job);
}

static void xent_sum_rows(void *ctx, size_t chunk, size_t begin, size_t end) {
    const xent_job *j = ctx;
    for (size_t i = begin; i < end; i++) {
        const float *l = j->logits + i * j->v;
        float mx = j->row_max[i];
        /* Every exponent is <= 0 once mx is the all-reduced maximum: nothing overflows. The
         * exponentials in float vectors, a block at a time; the sum in double, in order. */
        double s = 0.0;
        float e[XENT_BLOCK];
        for (size_t k0 = 0; k0 < j->v; k0 += XENT_BLOCK) {
            size_t len = j->v - k0 < XENT_BLOCK ? j->v - k0 : XENT_BLOCK;
            j->exp_shift(l + k0, mx, e, len);
            for (size_t k = 0; k < len; k++) s += (double)e[k];
        }
        j->out_sum[i] = (float)s;
        long r = mt_cpu_slice_row(j->targets[i], j->vocab_start, j->vocab_local);
        j->out_target[i] = r >= 0 ? l[r] : 0.0f;
    }
}

mt_status mt_cpu_op_xent_local_sums(const float *logits, const int *targets, size_t n,
                                    int vocab_start, int vocab_local, const float *row_max,
                                    float *sum_exp, float *target_logit) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(row_max[i]))
            return mt_error(MT_ERR_INVALID_ARG,
                            "xent_local_sums: row %zu has maximum %g (a non-finite logit, or no "
                            "logits at all)",
                            i, (double)row_max[i]);
    xent_job job = {.logits = logits, .targets = targets, .v = (size_t)vocab_local,
                    .vocab_start = vocab_start, .vocab_local = vocab_local, .row_max = row_max,
                    .out_sum = sum_exp, .out_target = target_logit,
                    .exp_shift = mt_exp_shift_pick()};
    return mt_cpu_parallel("xent_local_sums", n, mt_cpu_row_grain(job.v), xent_sum_rows, &job);
}

static void xent_loss_rows(void *ctx, size_t chunk, size_t begin, size_t end) {
    const xent_job *j = ctx;
    for (size_t i = begin; i < end; i++) {
        double lse = log((double)j->sum_exp[i]) + (double)j->row_max[i];
        j->loss[i] = (float)(lse - (double)j->target_logit[i]);
        if (!j->d_logits) continue;
        const float *l = j->logits + i * j->v;
        float *d = j->d_logits + i * j->v;
        /* softmax_k = exp(l_k - lse): one exponential per logit, no division; the exponent
         * formed in double, rounded once to float for the vector exp. */
        float e[XENT_BLOCK];
        for (size_t k0 = 0; k0 < j->v; k0 += XENT_BLOCK) {
            size_t len = j->v - k0 < XENT_BLOCK ? j->v - k0 : XENT_BLOCK;
            for (size_t k = 0; k < len; k++) e[k] = (float)((double)l[k0 + k] - lse);
            j->exp_shift(e, 0.0f, e, len);
            for (size_t k = 0; k < len; k++) d[k0 + k] += j->scale * e[k];
        }
        long r = mt_cpu_slice_row(j->targets[i], j->vocab_start, j->vocab_local);
        if (r >= 0) d[r] -= j->scale;
    }
}

mt_status mt_cpu_op_xent_loss_backward(const float *logits, const int *targets, size_t n,
                                       int vocab_start, int vocab_local, const float *row_max,
                                       const float *sum_exp, const float *target_logit,
                                       float scale, float *loss, float *d_logits) {
    for (size_t i = 0; i < n; i++)
        if (!(sum_exp[i] > 0.0f) || !isfinite(sum_exp[i]) || !isfinite(row_max[i]))
            return mt_error(MT_ERR_INVALID_ARG,
                            "xent_loss_backward: row %zu has sum %g and maximum %g (were the "
                            "all-reduces done?)",
                            i, (double)sum_exp[i], (double)row_max[i]);
    /* d_logits may be NULL: an evaluation pass wants the loss only. */
    xent_job job = {.logits = logits, .targets = targets, .v = (size_t)vocab_local,
                    .vocab_start = vocab_start, .vocab_local = vocab_local, .row_max = row_max,
                    .sum_exp = sum_exp, .target_logit = target_logit, .scale = scale,
                    .loss = loss, .d_logits = d_logits, .exp_shift = mt_exp_shift_pick()};
    return mt_cpu_parallel("xent_loss_backward", n, mt_cpu_row_grain(job.v), xent_loss_rows,
                           &job);
}
