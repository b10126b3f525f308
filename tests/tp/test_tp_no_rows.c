/* The tp linear backwards with no rows (n == 0; tp/tp_linear.c's mt_tp_backward_overwrite), in
 * one process on a tp context of size 1 filled in by hand (no mesh, no group):
 *   every backward that takes overwrite (column, row, and the sequence-parallel column,
 *   column kept gathered and row), f32 and bf16 weights, every combination of MT_OVERWRITE_D_IN,
 *   MT_OVERWRITE_D_W and MT_OVERWRITE_D_BIAS: d_w and d_b, filled with a sentinel, come out +0
 *   where flagged (a rank with no rows is still their first writer: its gradient is that of
 *   nothing) and keep the sentinel where not; the input gradient (no rows) is never touched,
 *   flagged or not;
 *   a flagged d_b that is NULL is skipped, d_w still zeroed;
 *   unknown bits (alone or with the known flags) are MT_ERR_INVALID_ARG naming the layer and the
 *   flags, with nothing written. */
#include "check.h"

#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/ops.h>
#include <meshtrain/tp.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { IN = 6, OUT = 5, W_ELEMS = IN * OUT, B_ELEMS = OUT, IN_ELEMS = 4 * IN };
static const float SENTINEL = 7.0f;

/* The buffers one call sees: its gradients and the operands it must not read (n == 0). */
typedef struct bufs {
    float *d_w, *d_b, *d_in;
    float *d_out, *in;
    void *w;
} bufs;

/* One tp backward at n = 0 with IN input and OUT output features (each layer's local sizes). */
typedef mt_status (*backward_fn)(const mt_tp_ctx *tp, const bufs *b, float *d_b, mt_dtype wt,
                                 unsigned overwrite);

static mt_status column(const mt_tp_ctx *tp, const bufs *b, float *d_b, mt_dtype wt,
                        unsigned overwrite) {
    return mt_tp_column_linear_backward(tp, b->d_out, b->in, b->w, wt, b->d_in, b->d_w, d_b, 0,
                                        IN, OUT, overwrite);
}
static mt_status row(const mt_tp_ctx *tp, const bufs *b, float *d_b, mt_dtype wt,
                     unsigned overwrite) {
    return mt_tp_row_linear_backward(tp, b->d_out, b->in, b->w, wt, b->d_in, b->d_w, d_b, 0, IN,
                                     OUT, overwrite);
}
static mt_status column_sp(const mt_tp_ctx *tp, const bufs *b, float *d_b, mt_dtype wt,
                           unsigned overwrite) {
    return mt_tp_column_linear_backward_sp(tp, b->d_out, b->in, b->w, wt, b->d_in, b->d_w, d_b,
                                           0, IN, OUT, overwrite);
}
static mt_status column_sp_gathered(const mt_tp_ctx *tp, const bufs *b, float *d_b, mt_dtype wt,
                                    unsigned overwrite) {
    return mt_tp_column_linear_backward_sp_gathered(tp, b->d_out, b->in, b->w, wt, b->d_in,
                                                    b->d_w, d_b, 0, IN, OUT, overwrite);
}
static mt_status row_sp(const mt_tp_ctx *tp, const bufs *b, float *d_b, mt_dtype wt,
                        unsigned overwrite) {
    return mt_tp_row_linear_backward_sp(tp, b->d_out, b->in, b->w, wt, b->d_in, b->d_w, d_b, 0,
                                        IN, OUT, overwrite);
}

static const struct {
    const char *name, *what; /* the function, and the layer as its errors name it */
    backward_fn fn;
} LAYERS[] = {
    {"mt_tp_column_linear_backward", "tp column-parallel linear backward", column},
    {"mt_tp_row_linear_backward", "tp row-parallel linear backward", row},
    {"mt_tp_column_linear_backward_sp",
     "tp column-parallel linear backward (sequence-parallel input)", column_sp},
    {"mt_tp_column_linear_backward_sp_gathered",
     "tp column-parallel linear backward (sequence-parallel input, kept gathered)",
     column_sp_gathered},
    {"mt_tp_row_linear_backward_sp", "tp row-parallel linear backward (sequence-parallel output)",
     row_sp},
};

static mt_device *dev;

static float *dev_floats(size_t n) {
    void *p = NULL;
    if (mt_device_alloc(dev, n * sizeof(float), MT_MEM_ACTIVATIONS, &p) != MT_OK) {
        fprintf(stderr, "allocating %zu floats: %s\n", n, mt_last_error());
        abort();
    }
    return p;
}

static void fill(float *d, size_t n, float v) {
    float *h = malloc(n * sizeof *h);
    if (!h) abort();
    for (size_t i = 0; i < n; i++) h[i] = v;
    if (mt_device_copy(dev, d, h, n * sizeof *h, MT_COPY_HOST_TO_DEVICE, NULL) != MT_OK) abort();
    free(h);
}

/* How many of d's n values differ in their bits from v (+0 differs from -0). */
static size_t count_not(const float *d, size_t n, float v) {
    float *h = malloc(n * sizeof *h);
    if (!h || mt_device_copy(dev, h, d, n * sizeof *h, MT_COPY_DEVICE_TO_HOST, NULL) != MT_OK)
        abort();
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&h[i], &v, sizeof v) != 0;
    free(h);
    return bad;
}

static void reset(const bufs *b) {
    fill(b->d_w, W_ELEMS, SENTINEL);
    fill(b->d_b, B_ELEMS, SENTINEL);
    fill(b->d_in, IN_ELEMS, SENTINEL);
}

/* Each gradient holds +0 where its flag is set, else the sentinel; d_in the sentinel. */
static void expect(const char *name, const bufs *b, bool b_passed, unsigned flags, mt_dtype wt,
                   const char *when) {
    float zero = 0.0f;
    size_t bad_w = count_not(b->d_w, W_ELEMS, flags & MT_OVERWRITE_D_W ? zero : SENTINEL);
    size_t bad_b = count_not(b->d_b, B_ELEMS,
                             b_passed && (flags & MT_OVERWRITE_D_BIAS) ? zero : SENTINEL);
    size_t bad_in = count_not(b->d_in, IN_ELEMS, SENTINEL);
    const char *dt = mt_dtype_name(wt);
    CHECK_MSG(bad_w == 0, "%s (%s, flags 0x%x%s): %zu of %d d_w values not %s", name, dt, flags,
              when, bad_w, W_ELEMS, flags & MT_OVERWRITE_D_W ? "+0" : "the sentinel");
    CHECK_MSG(bad_b == 0, "%s (%s, flags 0x%x%s): %zu of %d d_b values not %s", name, dt, flags,
              when, bad_b, B_ELEMS,
              b_passed && (flags & MT_OVERWRITE_D_BIAS) ? "+0" : "the sentinel");
    CHECK_MSG(bad_in == 0, "%s (%s, flags 0x%x%s): d_in changed (%zu values)", name, dt, flags,
              when, bad_in);
}

static void test_layer(const mt_tp_ctx *tp, const bufs *b, size_t l) {
    const char *name = LAYERS[l].name;
    static const mt_dtype dtypes[2] = {MT_F32, MT_BF16};
    for (int d = 0; d < 2; d++) {
        mt_dtype wt = dtypes[d];
        for (unsigned flags = 0;
             flags <= (MT_OVERWRITE_D_IN | MT_OVERWRITE_D_W | MT_OVERWRITE_D_BIAS); flags++) {
            reset(b);
            CHECK_OK(LAYERS[l].fn(tp, b, b->d_b, wt, flags));
            expect(name, b, true, flags, wt, "");
        }
        /* No bias: its flag has nothing to zero. */
        reset(b);
        CHECK_OK(LAYERS[l].fn(tp, b, NULL, wt, MT_OVERWRITE_D_W | MT_OVERWRITE_D_BIAS));
        expect(name, b, false, MT_OVERWRITE_D_W | MT_OVERWRITE_D_BIAS, wt, ", d_b NULL");
    }
    static const unsigned refused[] = {8u, MT_OVERWRITE_D_W | 16u,
                                       MT_OVERWRITE_D_IN | MT_OVERWRITE_D_W | MT_OVERWRITE_D_BIAS |
                                           32u};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        char said[160];
        snprintf(said, sizeof said, "%s: overwrite flags 0x%x", LAYERS[l].what, refused[i]);
        reset(b);
        CHECK_ERR(LAYERS[l].fn(tp, b, b->d_b, MT_F32, refused[i]), MT_ERR_INVALID_ARG, said,
                  "only MT_OVERWRITE_D_IN, MT_OVERWRITE_D_W and MT_OVERWRITE_D_BIAS");
        expect(name, b, true, 0, MT_F32, ", refused");
    }
}

int main(void) {
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return check_report("test_tp_no_rows");
    /* A context of size 1 without a group, as a mesh without a "tp" dimension gives, and no
     * kept scratch: nothing here communicates or needs scratch. */
    mt_tp_ctx tp = {.dev = dev, .group = NULL, .size = 1, .rank = 0, .scratch = NULL};
    bufs b = {dev_floats(W_ELEMS), dev_floats(B_ELEMS), dev_floats(IN_ELEMS),
              dev_floats(IN_ELEMS), dev_floats(IN_ELEMS), dev_floats(W_ELEMS)};
    /* Placeholders for the operands: with no rows there is nothing of them to read. */
    fill(b.d_out, IN_ELEMS, NAN);
    fill(b.in, IN_ELEMS, NAN);
    fill(b.w, W_ELEMS, NAN);
    for (size_t l = 0; l < sizeof LAYERS / sizeof *LAYERS; l++) test_layer(&tp, &b, l);
    float *all[] = {b.d_w, b.d_b, b.d_in, b.d_out, b.in, b.w};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) mt_device_free(dev, all[i]);
    mt_device_close(dev);
    return check_report("test_tp_no_rows");
}
