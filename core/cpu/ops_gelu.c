/* GELU (tanh form) and the residual add on the CPU device (include/meshtrain/ops.h, "GPT ops"),
 * elementwise in fixed chunks over the rank's pool. GELU runs the vector kernels of
 * core/cpu/gelu_vec.h (a vectorised tanh, within a few ulps of libm's; docs/cpu-kernels.md). */
#include "core/cpu/adamw_host.h"
#include "core/cpu/gelu_kernels.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/parallel.h"

typedef void (*gelu_fwd_fn)(const float *, float *, size_t);
typedef void (*gelu_bwd_fn)(const float *, const float *, float *, size_t, bool);

typedef struct elem_job {
    const float *a, *b;
    float *out;
    bool overwrite; /* GELU backward: out starts from 0 */
    gelu_fwd_fn fwd;
    gelu_bwd_fn bwd;
} elem_job;

/* The widest vector width the CPU runs, by the same check as the host AdamW's kernels
 * (core/cpu/adamw_host.c); every width gives the same bits (core/cpu/gelu_vec.h). */
static mt_adamw_isa widest_isa(void) {
    return mt_adamw_isa_supported(MT_ADAMW_AVX512) ? MT_ADAMW_AVX512
           : mt_adamw_isa_supported(MT_ADAMW_AVX2) ? MT_ADAMW_AVX2
                                                   : MT_ADAMW_SCALAR;
}

static void gelu_pick(elem_job *job) {
    static const gelu_fwd_fn fwd[MT_ADAMW_ISA_COUNT] = {
        mt_gelu_forward_generic, mt_gelu_forward_avx2, mt_gelu_forward_avx512};
    static const gelu_bwd_fn bwd[MT_ADAMW_ISA_COUNT] = {
        mt_gelu_backward_generic, mt_gelu_backward_avx2, mt_gelu_backward_avx512};
    mt_adamw_isa isa = widest_isa();
    job->fwd = fwd[isa];
    job->bwd = bwd[isa];
}

mt_exp_shift_fn mt_exp_shift_pick(void) {
    static const mt_exp_shift_fn exp_shift[MT_ADAMW_ISA_COUNT] = {
        mt_exp_shift_generic, mt_exp_shift_avx2, mt_exp_shift_avx512};
    return exp_shift[widest_isa()];
}

static void gelu_forward_chunk(void *ctx, size_t chunk, size_t begin, size_t end) {
    const elem_job *j = ctx;
    j->fwd(j->a + begin, j->out + begin, end - begin);
}

mt_status mt_cpu_op_gelu_forward(const float *in, float *out, size_t n) {
    elem_job job = {.a = in, .out = out};
    gelu_pick(&job);
    return mt_cpu_parallel("gelu_forward", n, MT_CPU_ELEM_GRAIN, gelu_forward_chunk, &job);
}

static void gelu_backward_chunk(void *ctx, size_t chunk, size_t begin, size_t end) {
    const elem_job *j = ctx;
    j->bwd(j->a + begin, j->b + begin, j->out + begin, end - begin, j->overwrite);
}

mt_status mt_cpu_op_gelu_backward(const float *in, const float *d_out, float *d_in, size_t n,
                                  bool overwrite) {
    elem_job job = {.a = in, .b = d_out, .out = d_in, .overwrite = overwrite};
    gelu_pick(&job);
    return mt_cpu_parallel("gelu_backward", n, MT_CPU_ELEM_GRAIN, gelu_backward_chunk, &job);
}

static void add_chunk(void *ctx, size_t chunk, size_t begin, size_t end) {
    const elem_job *j = ctx;
    for (size_t i = begin; i < end; i++) j->out[i] = j->a[i] + j->b[i];
}

mt_status mt_cpu_op_add(const float *a, const float *b, float *out, size_t n) {
    elem_job job = {.a = a, .b = b, .out = out};
    return mt_cpu_parallel("add", n, MT_CPU_ELEM_GRAIN, add_chunk, &job);
}
