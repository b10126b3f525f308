/* GPT ops on a CUDA device: embeddings, LayerNorm and the vocabulary-parallel cross-entropy (the
 * attention is in ops_attention.cu). The formulas are the CPU's (core/cpu/ops_gpt.c), with the
 * same double accumulation where the CPU uses it. Sums over rows into one parameter gradient
 * (d_wte, d_wpe, d_gamma, d_beta) run one thread per column adding the rows in order, as the CPU
 * does: no atomics, the same result on every run, the CPU's rounding. That is simple rather than
 * fast (the parallelism is the channel count); a faster version would reduce row chunks first. */
#include "core/cuda/ops_cuda.h"

#include <stdint.h>

/* Row of the slice that id selects, or -1 when id lies outside [start, start + local). */
__device__ inline long long slice_row(int id, int vocab_start, int vocab_local) {
    long long r = (long long)id - (long long)vocab_start;
    return (r >= 0 && r < vocab_local) ? r : -1;
}

/* ---- embeddings ------------------------------------------------------------------------------ */

__global__ void embedding_forward_kernel(const int *ids, size_t n, const float *wte,
                                         int vocab_start, int vocab_local, size_t c, float *out,
                                         bool accumulate) {
    MT_GRID_STRIDE(idx, n * c) {
        size_t i = idx / c, j = idx % c;
        long long r = slice_row(ids[i], vocab_start, vocab_local);
        if (r < 0) {
            if (!accumulate) out[idx] = 0.0f;
        } else if (accumulate) {
            out[idx] += wte[(size_t)r * c + j];
        } else {
            out[idx] = wte[(size_t)r * c + j];
        }
    }
}

/* Thread j walks the tokens in order: repeated ids add up in the CPU's order, without atomics. */
__global__ void embedding_backward_kernel(const int *ids, size_t n, const float *d_out,
                                          int vocab_start, int vocab_local, size_t c,
                                          float *d_wte) {
    MT_GRID_STRIDE(j, c) {
        for (size_t i = 0; i < n; i++) {
            long long r = slice_row(ids[i], vocab_start, vocab_local);
            if (r >= 0) d_wte[(size_t)r * c + j] += d_out[i * c + j];
        }
    }
}

extern "C" mt_status mt_cuda_op_embedding_forward(mt_device *dev, const int *ids, size_t n,
                                                  const float *wte, int vocab_start,
                                                  int vocab_local, int channels, float *out,
                                                  bool accumulate) {
    static const char *op = "embedding_forward";
    size_t c = (size_t)channels;
    if (n * c == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    MT_CUDA_LAUNCH(embedding_forward_kernel, n * c, ids, n, wte, vocab_start, vocab_local, c, out,
                   accumulate);
    return mt_cuda_ops_launched(dev, op);
}

extern "C" mt_status mt_cuda_op_embedding_backward(mt_device *dev, const int *ids, size_t n,
                                                   const float *d_out, int vocab_start,
                                                   int vocab_local, int channels, float *d_wte) {
    static const char *op = "embedding_backward";
    size_t c = (size_t)channels;
    if (n * c == 0 || vocab_local == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    MT_CUDA_LAUNCH(embedding_backward_kernel, c, ids, n, d_out, vocab_start, vocab_local, c, d_wte);
    return mt_cuda_ops_launched(dev, op);
}

__global__ void position_forward_kernel(const float *wpe, size_t per_seq, size_t total,
                                        float *out) {
    MT_GRID_STRIDE(idx, total) out[idx] += wpe[idx % per_seq];
}

__global__ void position_backward_kernel(const float *d_out, size_t batch, size_t per_seq,
                                         float *d_wpe) {
    MT_GRID_STRIDE(k, per_seq) {
        float acc = d_wpe[k];
        for (size_t b = 0; b < batch; b++) acc += d_out[b * per_seq + k];
        d_wpe[k] = acc;
    }
}

extern "C" mt_status mt_cuda_op_position_forward(mt_device *dev, const float *wpe, int batch,
                                                 int seq, int channels, float *out) {
    static const char *op = "position_forward";
    size_t per_seq = (size_t)seq * (size_t)channels, total = (size_t)batch * per_seq;
    if (total == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    MT_CUDA_LAUNCH(position_forward_kernel, total, wpe, per_seq, total, out);
    return mt_cuda_ops_launched(dev, op);
}

extern "C" mt_status mt_cuda_op_position_backward(mt_device *dev, const float *d_out, int batch,
                                                  int seq, int channels, float *d_wpe) {
    static const char *op = "position_backward";
    size_t per_seq = (size_t)seq * (size_t)channels;
    if (per_seq == 0 || batch == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    MT_CUDA_LAUNCH(position_backward_kernel, per_seq, d_out, (size_t)batch, per_seq, d_wpe);
    return mt_cuda_ops_launched(dev, op);
}

/* ---- LayerNorm ------------------------------------------------------------------------------- */

#define LAYERNORM_EPS 1e-5
/* One warp per row; a block holds this many rows. */
#define ROWS_PER_BLOCK 8

__device__ inline double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ void layernorm_forward_kernel(const float *in, const float *gamma, const float *beta,
                                         size_t n, size_t c, float *out, float *mean,
                                         float *rstd) {
    int lane = threadIdx.x & 31;
    size_t first = blockIdx.x * (size_t)ROWS_PER_BLOCK + (threadIdx.x >> 5);
    /* The whole warp takes the same rows, so the shuffles see every lane. */
    for (size_t i = first; i < n; i += (size_t)gridDim.x * ROWS_PER_BLOCK) {
        const float *x = in + i * c;
        double m = 0.0;
        for (size_t j = lane; j < c; j += 32) m += x[j];
        m = warp_sum(m) / (double)c;
        /* Two passes: the variance from the centred values does not cancel catastrophically. */
        double v = 0.0;
        for (size_t j = lane; j < c; j += 32) {
            double d = x[j] - m;
            v += d * d;
        }
        v = warp_sum(v) / (double)c;
        float mf = (float)m, rs = (float)(1.0 / sqrt(v + LAYERNORM_EPS));
        float *o = out + i * c;
        for (size_t j = lane; j < c; j += 32) o[j] = (x[j] - mf) * rs * gamma[j] + beta[j];
        if (lane == 0) {
            mean[i] = mf;
            rstd[i] = rs;
        }
    }
}

__global__ void layernorm_backward_in_kernel(const float *d_out, const float *in,
                                             const float *gamma, const float *mean,
                                             const float *rstd, size_t n, size_t c, float *d_in) {
    int lane = threadIdx.x & 31;
    size_t first = blockIdx.x * (size_t)ROWS_PER_BLOCK + (threadIdx.x >> 5);
    for (size_t i = first; i < n; i += (size_t)gridDim.x * ROWS_PER_BLOCK) {
        const float *x = in + i * c, *dy = d_out + i * c;
        float m = mean[i], rs = rstd[i];
        /* d_in = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dy * gamma. */
        double dn_mean = 0.0, dn_norm_mean = 0.0;
        for (size_t j = lane; j < c; j += 32) {
            double norm = (double)((x[j] - m) * rs);
            double dn = (double)gamma[j] * dy[j];
            dn_mean += dn;
            dn_norm_mean += dn * norm;
        }
        dn_mean = warp_sum(dn_mean) / (double)c;
        dn_norm_mean = warp_sum(dn_norm_mean) / (double)c;
        float *dx = d_in + i * c;
        for (size_t j = lane; j < c; j += 32) {
            float norm = (x[j] - m) * rs;
            float dn = gamma[j] * dy[j];
            dx[j] += (float)(((double)dn - dn_mean - (double)norm * dn_norm_mean) * rs);
        }
    }
}

__global__ void layernorm_backward_params_kernel(const float *d_out, const float *in,
                                                 const float *mean, const float *rstd, size_t n,
                                                 size_t c, float *d_gamma, float *d_beta) {
    MT_GRID_STRIDE(j, c) {
        float g = d_gamma[j], b = d_beta[j];
        for (size_t i = 0; i < n; i++) {
            float dy = d_out[i * c + j];
            float norm = (in[i * c + j] - mean[i]) * rstd[i];
            b += dy;
            g += norm * dy;
        }
        d_gamma[j] = g;
        d_beta[j] = b;
    }
}

static unsigned row_blocks(size_t n) {
    return mt_cuda_blocks(n, ROWS_PER_BLOCK);
}

extern "C" mt_status mt_cuda_op_layernorm_forward(mt_device *dev, const float *in,
                                                  const float *gamma, const float *beta, size_t n,
                                                  int channels, float *out, float *mean,
                                                  float *rstd) {
    static const char *op = "layernorm_forward";
    if (n == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    layernorm_forward_kernel<<<row_blocks(n), 32 * ROWS_PER_BLOCK>>>(in, gamma, beta, n,
                                                                      (size_t)channels, out, mean,
                                                                      rstd);
    return mt_cuda_ops_launched(dev, op);
}

extern "C" mt_status mt_cuda_op_layernorm_backward(mt_device *dev, const float *d_out,
                                                   const float *in, const float *gamma,
                                                   const float *mean, const float *rstd, size_t n,
                                                   int channels, float *d_in, float *d_gamma,
                                                   float *d_beta) {
    static const char *op = "layernorm_backward";
    if (n == 0) return MT_OK;
    size_t c = (size_t)channels;
    MT_TRY(mt_cuda_ops_select(dev, op));
    layernorm_backward_in_kernel<<<row_blocks(n), 32 * ROWS_PER_BLOCK>>>(d_out, in, gamma, mean,
                                                                          rstd, n, c, d_in);
    MT_TRY(mt_cuda_ops_launched(dev, op));
    MT_CUDA_LAUNCH(layernorm_backward_params_kernel, c, d_out, in, mean, rstd, n, c, d_gamma,
                   d_beta);
    return mt_cuda_ops_launched(dev, op);
}

/* ---- vocabulary-parallel cross-entropy ------------------------------------------------------- */

/* One block per row (grid-stride over rows; every thread of a block takes the same rows, so the
 * block reductions see all of them). */
#define ROW_LOOP(i, n) for (size_t i = blockIdx.x; i < (n); i += gridDim.x)

__global__ void xent_max_kernel(const float *logits, size_t n, size_t v, float *row_max) {
    ROW_LOOP(i, n) {
        /* An empty slice gives -inf, the identity of the MAX all-reduce. fmaxf skips NaN, as the
         * CPU's comparison does. */
        const float *l = logits + i * v;
        float mx = -INFINITY;
        for (size_t j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, l[j]);
        mx = mt_block_max(mx);
        if (threadIdx.x == 0) row_max[i] = mx;
    }
}

/* Records the lowest bad row, the one the CPU's in-order loop would have reported. */
__device__ inline void flag_row(unsigned long long *bad, size_t i) {
    if (threadIdx.x == 0) atomicMin(bad, (unsigned long long)i);
}

__global__ void xent_sums_kernel(const float *logits, const int *targets, size_t n,
                                 int vocab_start, int vocab_local, const float *row_max,
                                 float *sum_exp, float *target_logit, unsigned long long *bad) {
    size_t v = (size_t)vocab_local;
    ROW_LOOP(i, n) {
        float mx = row_max[i];
        if (!isfinite(mx)) { /* the same for the whole block: no thread waits at a barrier */
            flag_row(bad, i);
            continue;
        }
        const float *l = logits + i * v;
        /* Every exponent is <= 0 once mx is the all-reduced maximum: nothing overflows. */
        double s = 0.0;
        for (size_t j = threadIdx.x; j < v; j += blockDim.x) s += exp((double)(l[j] - mx));
        s = mt_block_sum<double>(s);
        if (threadIdx.x == 0) {
            sum_exp[i] = (float)s;
            long long r = slice_row(targets[i], vocab_start, vocab_local);
            target_logit[i] = r >= 0 ? l[r] : 0.0f;
        }
    }
}

__global__ void xent_loss_backward_kernel(const float *logits, const int *targets, size_t n,
                                          int vocab_start, int vocab_local, const float *row_max,
                                          const float *sum_exp, const float *target_logit,
                                          float scale, float *loss, float *d_logits,
                                          unsigned long long *bad) {
    size_t v = (size_t)vocab_local;
    ROW_LOOP(i, n) {
        float se = sum_exp[i], mx = row_max[i];
        if (!(se > 0.0f) || !isfinite(se) || !isfinite(mx)) {
            flag_row(bad, i);
            continue;
        }
        double lse = log((double)se) + (double)mx;
        if (threadIdx.x == 0) loss[i] = (float)(lse - (double)target_logit[i]);
        if (!d_logits) continue;
        const float *l = logits + i * v;
        float *d = d_logits + i * v;
        long long r = slice_row(targets[i], vocab_start, vocab_local);
        /* softmax_j = exp(l_j - lse): one exponential per logit, no division. */
        for (size_t j = threadIdx.x; j < v; j += blockDim.x) {
            float x = d[j] + scale * (float)exp((double)l[j] - lse);
            if ((long long)j == r) x -= scale;
            d[j] = x;
        }
    }
}

/* A device word for the lowest bad row, set to "none" (all ones). */
static mt_status bad_row_flag(mt_device *dev, const char *op, unsigned long long **flag) {
    MT_TRY(mt_device_alloc(dev, sizeof **flag, MT_MEM_OTHER, (void **)flag));
    cudaError_t err = cudaMemsetAsync(*flag, 0xff, sizeof **flag, 0);
    if (err == cudaSuccess) return MT_OK;
    (void)cudaGetLastError(); /* not the next op's error */
    mt_device_free(dev, *flag);
    *flag = NULL;
    return mt_error(MT_ERR_SYSTEM, "%s on %s: cudaMemsetAsync failed: %s", op,
                    mt_device_name(dev), cudaGetErrorString(err));
}

/* After the kernel that sets the flag: checks its launch, waits for it through the copy of the
 * flag and frees the flag. *row is the lowest bad row, SIZE_MAX when none was. */
static mt_status read_bad_row(mt_device *dev, const char *op, unsigned long long *flag,
                              size_t *row) {
    *row = SIZE_MAX;
    unsigned long long host = ~0ull;
    mt_status st = mt_cuda_ops_launched(dev, op);
    if (st == MT_OK) {
        cudaError_t err = cudaMemcpy(&host, flag, sizeof host, cudaMemcpyDeviceToHost);
        if (err != cudaSuccess) {
            (void)cudaGetLastError(); /* not the next op's error */
            st = mt_error(MT_ERR_SYSTEM, "%s on %s: waiting for the kernel failed: %s (%s)", op,
                          mt_device_name(dev), cudaGetErrorString(err), cudaGetErrorName(err));
        }
    }
    mt_device_free(dev, flag);
    if (st == MT_OK && host != ~0ull) *row = (size_t)host;
    return st;
}

/* One value of a device array, for an error message (NaN if it cannot be read). */
static double device_value(const float *p, size_t i) {
    float v = NAN;
    if (cudaMemcpy(&v, p + i, sizeof v, cudaMemcpyDeviceToHost) != cudaSuccess) {
        (void)cudaGetLastError();
        v = NAN;
    }
    return (double)v;
}

extern "C" mt_status mt_cuda_op_xent_local_max(mt_device *dev, const float *logits, size_t n,
                                               int vocab_local, float *row_max) {
    static const char *op = "xent_local_max";
    if (n == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    xent_max_kernel<<<mt_cuda_row_blocks(n), MT_CUDA_THREADS>>>(logits, n, (size_t)vocab_local,
                                                                row_max);
    return mt_cuda_ops_launched(dev, op);
}

extern "C" mt_status mt_cuda_op_xent_local_sums(mt_device *dev, const float *logits,
                                                const int *targets, size_t n, int vocab_start,
                                                int vocab_local, const float *row_max,
                                                float *sum_exp, float *target_logit) {
    static const char *op = "xent_local_sums";
    if (n == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    unsigned long long *flag = NULL;
    MT_TRY(bad_row_flag(dev, op, &flag));
    xent_sums_kernel<<<mt_cuda_row_blocks(n), MT_CUDA_THREADS>>>(
        logits, targets, n, vocab_start, vocab_local, row_max, sum_exp, target_logit, flag);
    size_t bad;
    mt_status st = read_bad_row(dev, op, flag, &bad);
    if (st == MT_OK && bad != SIZE_MAX)
        st = mt_error(MT_ERR_INVALID_ARG,
                      "xent_local_sums: row %zu has maximum %g (a non-finite logit, or no logits "
                      "at all)",
                      bad, device_value(row_max, bad));
    return st;
}

extern "C" mt_status mt_cuda_op_xent_loss_backward(mt_device *dev, const float *logits,
                                                   const int *targets, size_t n, int vocab_start,
                                                   int vocab_local, const float *row_max,
                                                   const float *sum_exp, const float *target_logit,
                                                   float scale, float *loss, float *d_logits) {
    static const char *op = "xent_loss_backward";
    if (n == 0) return MT_OK;
    MT_TRY(mt_cuda_ops_select(dev, op));
    unsigned long long *flag = NULL;
    MT_TRY(bad_row_flag(dev, op, &flag));
    xent_loss_backward_kernel<<<mt_cuda_row_blocks(n), MT_CUDA_THREADS>>>(
        logits, targets, n, vocab_start, vocab_local, row_max, sum_exp, target_logit, scale, loss,
        d_logits, flag);
    size_t bad;
    mt_status st = read_bad_row(dev, op, flag, &bad);
    if (st == MT_OK && bad != SIZE_MAX)
        st = mt_error(MT_ERR_INVALID_ARG,
                      "xent_loss_backward: row %zu has sum %g and maximum %g (were the "
                      "all-reduces done?)",
                      bad, device_value(sum_exp, bad), device_value(row_max, bad));
    return st;
}
