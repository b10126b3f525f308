/* Token and position embeddings on the CPU device (include/meshtrain/ops.h, "GPT ops"), split
 * over the rank's pool. The forwards are independent per row. The backwards sum rows into one
 * table, so they are split by columns instead: each chunk owns its columns of every table row
 * and adds the rows in their order, giving the bits of one thread adding every row in turn. */
#include "core/cpu/ops_cpu.h"
#include "core/cpu/ops_gpt_internal.h"
#include "core/cpu/parallel.h"

typedef struct embed_job {
    const int *ids;
    size_t n, c;
    const float *src;
    float *dst;
    int vocab_start, vocab_local;
    bool accumulate;
} embed_job;

static void embed_rows(void *ctx, size_t chunk, size_t begin, size_t end) {
    const embed_job *j = ctx;
    size_t c = j->c;
    for (size_t i = begin; i < end; i++) {
        float *o = j->dst + i * c;
        long r = mt_cpu_slice_row(j->ids[i], j->vocab_start, j->vocab_local);
        if (r < 0) {
            if (!j->accumulate)
                for (size_t k = 0; k < c; k++) o[k] = 0.0f;
            continue;
        }
        const float *w = j->src + (size_t)r * c;
        if (j->accumulate)
            for (size_t k = 0; k < c; k++) o[k] += w[k];
        else
            for (size_t k = 0; k < c; k++) o[k] = w[k];
    }
}

mt_status mt_cpu_op_embedding_forward(const int *ids, size_t n, const float *wte, int vocab_start,
                                      int vocab_local, int channels, float *out, bool accumulate) {
    size_t c = (size_t)channels;
    embed_job job = {ids, n, c, wte, out, vocab_start, vocab_local, accumulate};
    return mt_cpu_parallel("embedding_forward", n, mt_cpu_row_grain(c), embed_rows, &job);
}

/* Columns [begin, end) of every selected table row, the rows of d_out in order. */
static void embed_grad_cols(void *ctx, size_t chunk, size_t begin, size_t end) {
    const embed_job *j = ctx;
    size_t c = j->c;
    for (size_t i = 0; i < j->n; i++) {
        long r = mt_cpu_slice_row(j->ids[i], j->vocab_start, j->vocab_local);
        if (r < 0) continue;
        float *g = j->dst + (size_t)r * c;
        const float *d = j->src + i * c;
        for (size_t k = begin; k < end; k++) g[k] += d[k];
    }
}

mt_status mt_cpu_op_embedding_backward(const int *ids, size_t n, const float *d_out,
                                       int vocab_start, int vocab_local, int channels,
                                       float *d_wte) {
    size_t c = (size_t)channels;
    embed_job job = {ids, n, c, d_out, d_wte, vocab_start, vocab_local, true};
    return mt_cpu_parallel("embedding_backward", c, MT_CPU_COL_GRAIN, embed_grad_cols, &job);
}

typedef struct position_job {
    const float *src;
    float *dst;
    size_t batch, plane; /* plane: seq * channels, one batch entry */
    bool zero_first;     /* backward: d_wpe starts from 0 (overwrite) */
} position_job;

/* out[b][i] += wpe[i] over elements [begin, end) of the flattened (batch, plane). */
static void position_add(void *ctx, size_t chunk, size_t begin, size_t end) {
    const position_job *j = ctx;
    for (size_t i = begin; i < end;) {
        size_t at = i % j->plane, len = j->plane - at < end - i ? j->plane - at : end - i;
        float *o = j->dst + i;
        const float *w = j->src + at;
        for (size_t k = 0; k < len; k++) o[k] += w[k];
        i += len;
    }
}

mt_status mt_cpu_op_position_forward(const float *wpe, int batch, int seq, int channels,
                                     float *out) {
    size_t plane = (size_t)seq * (size_t)channels;
    position_job job = {wpe, out, (size_t)batch, plane, false};
    return mt_cpu_parallel("position_forward", job.batch * plane, MT_CPU_ELEM_GRAIN, position_add,
                           &job);
}

/* d_wpe[i] += d_out[b][i] for b in order, elements [begin, end) of one plane. */
static void position_grad(void *ctx, size_t chunk, size_t begin, size_t end) {
    const position_job *j = ctx;
    if (j->zero_first)
        for (size_t i = begin; i < end; i++) j->dst[i] = 0.0f;
    for (size_t b = 0; b < j->batch; b++) {
        const float *d = j->src + b * j->plane;
        for (size_t i = begin; i < end; i++) j->dst[i] += d[i];
    }
}

mt_status mt_cpu_op_position_backward(const float *d_out, int batch, int seq, int channels,
                                      float *d_wpe, bool overwrite) {
    size_t plane = (size_t)seq * (size_t)channels;
    position_job job = {d_out, d_wpe, (size_t)batch, plane, overwrite};
    return mt_cpu_parallel("position_backward", plane, MT_CPU_ELEM_GRAIN, position_grad, &job);
}
