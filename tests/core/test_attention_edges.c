/* The CPU attention (core/cpu/ops_attention.c) at the sizes where its blocks of 64 rows and its
 * chunks of pairs have edges: sequences of 1, 2, 63, 64, 65 and 130 positions, head sizes of 1,
 * 3, 12 and 20 (not multiples of the kernels' 16), batches and heads that leave the last chunk
 * of pairs short. Forward and backward against a plain double-precision reference, elementwise,
 * with a tolerance far below what an index error gives; the backward adds into a prefilled d_qkv
 * and must not read att above the diagonal (filled with NaN here). */
#include "check.h"
#include "numeric.h"

#include <meshtrain/device.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t rng_state = 0xa77e2d9eULL;

typedef struct shape {
    int b, t, nh, hd;
} shape;

/* out (B x T x NH*HD), att (B x NH x T x T) and d_qkv (B x T x 3*NH*HD) of causal attention in
 * double, for the objective sum(out * dy). */
static void ref_attention(shape s, const float *qkv, const float *dy, double *out, double *att,
                          double *dqkv) {
    size_t T = (size_t)s.t, hd = (size_t)s.hd, w = (size_t)s.nh * hd, ld = 3 * w;
    double scale = 1.0 / sqrt((double)s.hd);
    double *datt = malloc(T * sizeof *datt);
    if (!datt) abort();
    for (size_t b = 0; b < (size_t)s.b; b++)
        for (size_t h = 0; h < (size_t)s.nh; h++) {
            const float *base = qkv + b * T * ld;
            double *a = att + (b * (size_t)s.nh + h) * T * T;
            double *dbase = dqkv + b * T * ld;
            for (size_t t = 0; t < T; t++) {
                const float *q = base + t * ld + h * hd;
                double mx = -INFINITY, sum = 0.0;
                for (size_t u = 0; u < T; u++) {
                    double x = 0.0;
                    for (size_t d = 0; d < hd; d++)
                        x += (double)q[d] * (double)base[u * ld + w + h * hd + d];
                    a[t * T + u] = u <= t ? x * scale : 0.0;
                    if (u <= t && a[t * T + u] > mx) mx = a[t * T + u];
                }
                for (size_t u = 0; u <= t; u++) sum += (a[t * T + u] = exp(a[t * T + u] - mx));
                for (size_t u = 0; u <= t; u++) a[t * T + u] /= sum;
                for (size_t d = 0; d < hd; d++) {
                    double o = 0.0;
                    for (size_t u = 0; u <= t; u++)
                        o += a[t * T + u] * (double)base[u * ld + 2 * w + h * hd + d];
                    out[(b * T + t) * w + h * hd + d] = o;
                }
                /* Backward of row t: dV_u += a_tu dy_t; datt_u = dy_t . v_u; the softmax's
                 * input gradient ds_u = a_tu (datt_u - sum a datt); dQ_t += scale ds K;
                 * dK_u += scale ds_u q_t. */
                const float *g = dy + (b * T + t) * w + h * hd;
                double adot = 0.0;
                for (size_t u = 0; u <= t; u++) {
                    double x = 0.0;
                    for (size_t d = 0; d < hd; d++)
                        x += (double)g[d] * (double)base[u * ld + 2 * w + h * hd + d];
                    datt[u] = x;
                    adot += a[t * T + u] * x;
                }
                for (size_t u = 0; u <= t; u++) {
                    double ds = a[t * T + u] * (datt[u] - adot) * scale;
                    for (size_t d = 0; d < hd; d++) {
                        dbase[t * ld + h * hd + d] += ds * (double)base[u * ld + w + h * hd + d];
                        dbase[u * ld + w + h * hd + d] += ds * (double)q[d];
                        dbase[u * ld + 2 * w + h * hd + d] += a[t * T + u] * (double)g[d];
                    }
                }
            }
        }
    free(datt);
}

/* Elements of got that are not within rel * (scale of the values) of want; prints the first. */
static int count_bad(const char *what, shape s, const float *got, const double *want, size_t n,
                     double rel) {
    double big = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs(want[i]) > big) big = fabs(want[i]);
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!test_close_to((double)got[i], want[i], rel, rel * big)) {
            if (!bad)
                fprintf(stderr, "  %s (B %d T %d NH %d HD %d) [%zu]: got %.8g want %.8g\n", what,
                        s.b, s.t, s.nh, s.hd, i, (double)got[i], want[i]);
            bad++;
        }
    return bad;
}

static void run_shape(mt_device *dev, shape s) {
    size_t T = (size_t)s.t, w = (size_t)s.nh * (size_t)s.hd;
    size_t nq = (size_t)s.b * T * 3 * w, no = (size_t)s.b * T * w;
    size_t na = (size_t)s.b * (size_t)s.nh * T * T;
    float *qkv = test_lcg_floats(&rng_state, nq, 1.5);
    float *dy = test_lcg_floats(&rng_state, no, 1.0);
    float *d_qkv = test_lcg_floats(&rng_state, nq, 0.5);
    float *out = malloc(no * sizeof *out), *att = malloc(na * sizeof *att);
    double *r_out = calloc(no, sizeof *r_out), *r_att = calloc(na, sizeof *r_att);
    double *r_dqkv = malloc(nq * sizeof *r_dqkv);
    if (!out || !att || !r_out || !r_att || !r_dqkv) abort();
    for (size_t i = 0; i < nq; i++) r_dqkv[i] = d_qkv[i]; /* the backward adds */
    ref_attention(s, qkv, dy, r_out, r_att, r_dqkv);

    CHECK_OK(mt_op_attention_forward(dev, qkv, s.b, s.t, s.nh, s.hd, out, att));
    CHECK_MSG(count_bad("out", s, out, r_out, no, 2e-5) == 0, "forward out");
    CHECK_MSG(count_bad("att", s, att, r_att, na, 2e-5) == 0, "forward att");
    /* The masked half is never read by the backward. */
    for (size_t p = 0; p < (size_t)s.b * (size_t)s.nh; p++)
        for (size_t t = 0; t < T; t++)
            for (size_t u = t + 1; u < T; u++) att[(p * T + t) * T + u] = NAN;
    CHECK_OK(mt_op_attention_backward(dev, dy, qkv, att, s.b, s.t, s.nh, s.hd, d_qkv));
    CHECK_MSG(count_bad("d_qkv", s, d_qkv, r_dqkv, nq, 2e-5) == 0, "backward d_qkv");
    free(qkv);
    free(dy);
    free(d_qkv);
    free(out);
    free(att);
    free(r_out);
    free(r_att);
    free(r_dqkv);
}

int main(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    static const int seqs[] = {1, 2, 63, 64, 65, 130};
    static const int hds[] = {1, 3, 12, 20};
    for (size_t i = 0; i < sizeof seqs / sizeof *seqs; i++)
        for (size_t k = 0; k < sizeof hds / sizeof *hds; k++)
            run_shape(dev, (shape){2, seqs[i], 3, hds[k]});
    /* 9 pairs: 5 chunks of 2 pairs, the last one short; 17 pairs: 6 chunks of 3, the last of 2. */
    run_shape(dev, (shape){3, 65, 3, 5});
    run_shape(dev, (shape){17, 9, 1, 7});
    mt_device_close(dev);
    return check_report("test_attention_edges");
}
