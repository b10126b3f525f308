/* The sequence-parallel tp functions (tp/tp_sequence.c) against the replicated ones (run through
 * mtrun on 1, 2 and 4 ranks, all on the mesh's "tp" dimension):
 *   gather / reduce-scatter of rows;
 *   column-parallel forward from a row shard = the replicated forward; its backward: d_w, d_b
 *   equal, d_in_shard = this rank's rows of the replicated d_in, added to what it held; the
 *   same for the kept-gathered pair (_sp_gathered: the forward leaves the replicated input in
 *   the caller's buffer, the backward takes it), whose backward communicates only the input
 *   gradient's reduce-scatter;
 *   row-parallel forward = this rank's rows of the replicated output; its backward from the row
 *   shard of the output gradient = the replicated backward (d_b the full bias gradient);
 *   vocab embedding and the position embedding on a shard that starts inside a sequence (3
 *   sequences of 4 tokens on 4 ranks: 3 rows each);
 *   the gradient sum over tp; the tp group's traffic counters (mt_group_counters) of one
 *   sequence-parallel column forward and backward; and the errors: rows tp does not divide,
 *   seq tp does not divide.
 * Inputs the replicated functions need on every rank are generated from the same seed; the
 * per-rank parts (weights, sharded inputs) from a seed of the rank. Tolerance: 1e-5 of the
 * largest magnitude (the reductions add the tp parts in other orders). */
#include "check.h"
#include "numeric.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BATCH = 3, SEQ = 4, N = BATCH * SEQ, IN = 6, OUT_LOCAL = 5, OUT = 7, VOCAB_LOCAL = 9 };

static mt_device *dev;

static float *up(const float *host, size_t n) {
    void *d = NULL;
    if (mt_device_alloc(dev, n * sizeof(float), MT_MEM_ACTIVATIONS, &d) != MT_OK ||
        mt_device_copy(dev, d, host, n * sizeof(float), MT_COPY_HOST_TO_DEVICE, NULL) != MT_OK) {
        fprintf(stderr, "upload of %zu floats: %s\n", n, mt_last_error());
        abort();
    }
    return d;
}

static float *rand_dev(uint64_t seed, size_t n) {
    uint64_t s = seed;
    float *h = test_lcg_floats(&s, n, 1.0);
    float *d = up(h, n);
    free(h);
    return d;
}

static float *zeros_dev(size_t n) {
    float *h = calloc(n, sizeof *h), *d = up(h, n);
    free(h);
    return d;
}

static float *down(const float *d, size_t n) {
    float *h = malloc(n * sizeof *h);
    if (!h || mt_device_copy(dev, h, d, n * sizeof *h, MT_COPY_DEVICE_TO_HOST, NULL) != MT_OK)
        abort();
    return h;
}

/* got (n values on the device) against want (host): within 1e-5 of want's largest magnitude. */
static void expect_close(const char *what, const float *got_dev, const float *want, size_t n) {
    float *got = down(got_dev, n);
    double scale = 0.0, worst = 0.0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
    CHECK_MSG(scale > 0.0 && worst <= 1e-5 * scale, "%s: largest difference %g (scale %g)", what,
              worst, scale);
    free(got);
}

static void expect_error(mt_status st, const char *needle) {
    CHECK_MSG(st == MT_ERR_INVALID_ARG && strstr(mt_last_error(), needle),
              "expected an error naming '%s', got status %d: %s", needle, (int)st,
              mt_last_error());
}

static void test_column(const mt_tp_ctx *tp, int rows) {
    size_t R = (size_t)rows, off = (size_t)tp->rank * R;
    float *in = rand_dev(11, N * IN), *w = rand_dev(100 + tp->rank, OUT_LOCAL * IN);
    float *b = rand_dev(200 + tp->rank, OUT_LOCAL);
    float *in_host = down(in, N * IN);
    float *in_shard = up(in_host + off * IN, R * IN);
    float *out = zeros_dev(N * OUT_LOCAL), *out_sp = zeros_dev(N * OUT_LOCAL);
    CHECK_OK(mt_tp_column_linear_forward(tp, in, w, MT_F32, b, out, N, IN, OUT_LOCAL));
    CHECK_OK(mt_tp_column_linear_forward_sp(tp, in_shard, w, MT_F32, b, out_sp, N, IN,
                                            OUT_LOCAL));
    float *want = down(out, N * OUT_LOCAL);
    expect_close("column forward", out_sp, want, N * OUT_LOCAL);
    free(want);

    float *d_out = rand_dev(300 + tp->rank, N * OUT_LOCAL);
    float *d_in = zeros_dev(N * IN), *d_w = zeros_dev(OUT_LOCAL * IN), *d_b = zeros_dev(OUT_LOCAL);
    float *held = rand_dev(400 + tp->rank, R * IN); /* d_in_shard's += */
    float *held_copy = down(held, R * IN), *d_in_sp = up(held_copy, R * IN);
    free(held_copy);
    float *d_w_sp = zeros_dev(OUT_LOCAL * IN), *d_b_sp = zeros_dev(OUT_LOCAL);
    CHECK_OK(mt_tp_column_linear_backward(tp, d_out, in, w, MT_F32, d_in, d_w, d_b, N, IN,
                                          OUT_LOCAL, 0));
    CHECK_OK(mt_tp_column_linear_backward_sp(tp, d_out, in_shard, w, MT_F32, d_in_sp, d_w_sp,
                                             d_b_sp, N, IN, OUT_LOCAL, 0));
    float *want_in = down(d_in, N * IN), *held_h = down(held, R * IN);
    for (size_t i = 0; i < R * IN; i++) held_h[i] += want_in[off * IN + i];
    expect_close("column backward d_in (this rank's rows, accumulated)", d_in_sp, held_h,
                 R * IN);
    float *want_w = down(d_w, OUT_LOCAL * IN), *want_b = down(d_b, OUT_LOCAL);
    expect_close("column backward d_w", d_w_sp, want_w, OUT_LOCAL * IN);
    expect_close("column backward d_b", d_b_sp, want_b, OUT_LOCAL);
    /* Without d_in: the weight gradient alone, accumulated once more. */
    CHECK_OK(mt_tp_column_linear_backward_sp(tp, d_out, in_shard, w, MT_F32, NULL, d_w_sp, NULL,
                                             N, IN, OUT_LOCAL, 0));
    for (size_t i = 0; i < OUT_LOCAL * IN; i++) want_w[i] *= 2.0f;
    expect_close("column backward d_w without d_in", d_w_sp, want_w, OUT_LOCAL * IN);
    if (tp->size > 1) /* rows that do not split evenly */
        expect_error(mt_tp_column_linear_forward_sp(tp, in_shard, w, MT_F32, b, out_sp,
                                                    tp->size * 3 + 1, IN, OUT_LOCAL),
                     "not divisible by tp");
    free(in_host);
    free(want_in);
    free(held_h);
    free(want_w);
    free(want_b);
    float *bufs[] = {in, w, b, in_shard, out, out_sp, d_out, d_in, d_w, d_b, held, d_in_sp,
                     d_w_sp, d_b_sp};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) mt_device_free(dev, bufs[i]);
}

/* The kept-gathered pair against the replicated functions, and its traffic: the forward's
 * all-gather, the backward's reduce-scatter, nothing else (no re-gather). */
static void test_column_gathered(const mt_tp_ctx *tp, int rows) {
    size_t R = (size_t)rows, off = (size_t)tp->rank * R;
    float *in = rand_dev(21, N * IN), *w = rand_dev(120 + tp->rank, OUT_LOCAL * IN);
    float *b = rand_dev(220 + tp->rank, OUT_LOCAL);
    float *in_host = down(in, N * IN);
    float *in_shard = up(in_host + off * IN, R * IN), *in_full = zeros_dev(N * IN);
    float *out = zeros_dev(N * OUT_LOCAL), *out_sp = zeros_dev(N * OUT_LOCAL);
    float *d_out = rand_dev(320 + tp->rank, N * OUT_LOCAL);
    float *d_in = zeros_dev(N * IN), *d_w = zeros_dev(OUT_LOCAL * IN), *d_b = zeros_dev(OUT_LOCAL);
    float *held = rand_dev(420 + tp->rank, R * IN); /* d_in_shard's += */
    float *held_h = down(held, R * IN), *d_in_sp = up(held_h, R * IN);
    float *d_w_sp = zeros_dev(OUT_LOCAL * IN), *d_b_sp = zeros_dev(OUT_LOCAL);
    /* The replicated references first, so that the counters see the kept-gathered pair alone. */
    CHECK_OK(mt_tp_column_linear_forward(tp, in, w, MT_F32, b, out, N, IN, OUT_LOCAL));
    CHECK_OK(mt_tp_column_linear_backward(tp, d_out, in, w, MT_F32, d_in, d_w, d_b, N, IN,
                                          OUT_LOCAL, 0));
    mt_group_counters_reset(tp->group);
    CHECK_OK(mt_tp_column_linear_forward_sp_gathered(tp, in_shard, in_full, w, MT_F32, b, out_sp,
                                                     N, IN, OUT_LOCAL));
    expect_close("kept-gathered column forward: the gathered input", in_full, in_host, N * IN);
    float *want = down(out, N * OUT_LOCAL);
    expect_close("kept-gathered column forward", out_sp, want, N * OUT_LOCAL);
    free(want);
    CHECK_OK(mt_tp_column_linear_backward_sp_gathered(tp, d_out, in_full, w, MT_F32, d_in_sp,
                                                      d_w_sp, d_b_sp, N, IN, OUT_LOCAL, 0));
    mt_comm_counters c;
    mt_group_counters(tp->group, &c);
    uint64_t bytes = tp->size > 1 ? (uint64_t)N * IN * sizeof(float) : 0;
    uint64_t calls = tp->size > 1 ? 1 : 0;
    CHECK_MSG(c.calls[MT_COLL_ALL_GATHER] == calls && c.bytes[MT_COLL_ALL_GATHER] == bytes &&
                  c.calls[MT_COLL_REDUCE_SCATTER] == calls &&
                  c.bytes[MT_COLL_REDUCE_SCATTER] == bytes && c.calls[MT_COLL_ALL_REDUCE] == 0,
              "kept gathered: all-gathers %llu calls %llu B, reduce-scatters %llu calls %llu B, "
              "all-reduces %llu; expected the forward's gather and the backward's "
              "reduce-scatter alone", (unsigned long long)c.calls[MT_COLL_ALL_GATHER],
              (unsigned long long)c.bytes[MT_COLL_ALL_GATHER],
              (unsigned long long)c.calls[MT_COLL_REDUCE_SCATTER],
              (unsigned long long)c.bytes[MT_COLL_REDUCE_SCATTER],
              (unsigned long long)c.calls[MT_COLL_ALL_REDUCE]);
    float *want_in = down(d_in, N * IN);
    for (size_t i = 0; i < R * IN; i++) held_h[i] += want_in[off * IN + i];
    expect_close("kept-gathered column backward d_in (this rank's rows, accumulated)", d_in_sp,
                 held_h, R * IN);
    float *want_w = down(d_w, OUT_LOCAL * IN), *want_b = down(d_b, OUT_LOCAL);
    expect_close("kept-gathered column backward d_w", d_w_sp, want_w, OUT_LOCAL * IN);
    expect_close("kept-gathered column backward d_b", d_b_sp, want_b, OUT_LOCAL);
    expect_error(mt_tp_column_linear_backward_sp_gathered(tp, d_out, NULL, w, MT_F32, d_in_sp,
                                                          d_w_sp, d_b_sp, N, IN, OUT_LOCAL, 0),
                 "in_full (the input gathered in forward) must not be NULL");
    expect_error(mt_tp_column_linear_forward_sp_gathered(tp, in_shard, NULL, w, MT_F32, b, out_sp,
                                                         N, IN, OUT_LOCAL),
                 "in_shard and in_full must not be NULL");
    free(in_host);
    free(want_in);
    free(held_h);
    free(want_w);
    free(want_b);
    float *bufs[] = {in, w, b, in_shard, in_full, out, out_sp, d_out, d_in, d_w, d_b, held,
                     d_in_sp, d_w_sp, d_b_sp};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) mt_device_free(dev, bufs[i]);
}

static void test_row(const mt_tp_ctx *tp, int rows) {
    size_t R = (size_t)rows, off = (size_t)tp->rank * R;
    float *in = rand_dev(500 + tp->rank, N * IN), *w = rand_dev(600 + tp->rank, OUT * IN);
    float *b = rand_dev(12, OUT);
    float *out = zeros_dev(N * OUT), *out_sp = zeros_dev(R * OUT);
    CHECK_OK(mt_tp_row_linear_forward(tp, in, w, MT_F32, b, out, N, IN, OUT));
    CHECK_OK(mt_tp_row_linear_forward_sp(tp, in, w, MT_F32, b, out_sp, N, IN, OUT));
    float *want = down(out, N * OUT);
    expect_close("row forward (this rank's rows)", out_sp, want + off * OUT, R * OUT);

    float *d_out = rand_dev(13, N * OUT), *d_out_h = down(d_out, N * OUT);
    float *d_out_shard = up(d_out_h + off * OUT, R * OUT);
    float *d_in = zeros_dev(N * IN), *d_w = zeros_dev(OUT * IN), *d_b = zeros_dev(OUT);
    float *d_in_sp = zeros_dev(N * IN), *d_w_sp = zeros_dev(OUT * IN), *d_b_sp = zeros_dev(OUT);
    CHECK_OK(mt_tp_row_linear_backward(tp, d_out, in, w, MT_F32, d_in, d_w, d_b, N, IN, OUT, 0));
    CHECK_OK(mt_tp_row_linear_backward_sp(tp, d_out_shard, in, w, MT_F32, d_in_sp, d_w_sp,
                                          d_b_sp, N, IN, OUT, 0));
    float *w_in = down(d_in, N * IN), *w_w = down(d_w, OUT * IN), *w_b = down(d_b, OUT);
    expect_close("row backward d_in", d_in_sp, w_in, N * IN);
    expect_close("row backward d_w", d_w_sp, w_w, OUT * IN);
    expect_close("row backward d_b (the full bias gradient)", d_b_sp, w_b, OUT);
    free(want);
    free(d_out_h);
    free(w_in);
    free(w_w);
    free(w_b);
    float *bufs[] = {in, w, b, out, out_sp, d_out, d_out_shard, d_in, d_w, d_b, d_in_sp, d_w_sp,
                     d_b_sp};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) mt_device_free(dev, bufs[i]);
}

static void test_embeddings(const mt_tp_ctx *tp, int rows) {
    size_t R = (size_t)rows, off = (size_t)tp->rank * R;
    int ids_h[N];
    for (int i = 0; i < N; i++) ids_h[i] = (i * 7 + 3) % (VOCAB_LOCAL * tp->size);
    int *ids = NULL;
    if (mt_device_alloc(dev, sizeof ids_h, MT_MEM_ACTIVATIONS, (void **)&ids) != MT_OK ||
        mt_device_copy(dev, ids, ids_h, sizeof ids_h, MT_COPY_HOST_TO_DEVICE, NULL) != MT_OK)
        abort();
    float *wte = rand_dev(700 + tp->rank, VOCAB_LOCAL * IN), *wpe = rand_dev(14, SEQ * IN);
    float *out = zeros_dev(N * IN), *out_sp = zeros_dev(R * IN);
    CHECK_OK(mt_tp_vocab_embedding_forward(tp, ids, N, wte, VOCAB_LOCAL, IN, out));
    CHECK_OK(mt_tp_vocab_embedding_forward_sp(tp, ids, N, wte, VOCAB_LOCAL, IN, out_sp));
    float *want = down(out, N * IN);
    expect_close("vocab embedding forward (this rank's rows)", out_sp, want + off * IN, R * IN);
    free(want);
    CHECK_OK(mt_op_position_forward(dev, wpe, BATCH, SEQ, IN, out));
    CHECK_OK(mt_tp_sequence_position_forward(tp, wpe, N, SEQ, IN, out_sp));
    want = down(out, N * IN);
    expect_close("position embedding on the shard", out_sp, want + off * IN, R * IN);
    /* Gathering the shards gives the full rows back. */
    float *full = zeros_dev(N * IN);
    CHECK_OK(mt_tp_sequence_gather(tp, out_sp, full, N, IN));
    expect_close("gather of the shards", full, want, N * IN);
    free(want);
    float *bufs[] = {wte, wpe, out, out_sp, full};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) mt_device_free(dev, bufs[i]);
    mt_device_free(dev, ids);
}

/* A column-parallel forward and backward with a sequence-parallel input: three collectives of
 * n x in floats, counted on the tp group (nothing at tp 1, where the functions copy). */
static void test_counters(const mt_tp_ctx *tp, int rows) {
    float *in = rand_dev(15, (size_t)rows * IN), *w = rand_dev(16, OUT_LOCAL * IN);
    float *out = zeros_dev(N * OUT_LOCAL), *d_in = zeros_dev((size_t)rows * IN);
    float *d_w = zeros_dev(OUT_LOCAL * IN);
    mt_group_counters_reset(tp->group);
    CHECK_OK(mt_tp_column_linear_forward_sp(tp, in, w, MT_F32, NULL, out, N, IN, OUT_LOCAL));
    CHECK_OK(mt_tp_column_linear_backward_sp(tp, out, in, w, MT_F32, d_in, d_w, NULL, N, IN,
                                             OUT_LOCAL, 0));
    mt_comm_counters c;
    mt_group_counters(tp->group, &c);
    uint64_t bytes = tp->size > 1 ? (uint64_t)N * IN * sizeof(float) : 0;
    uint64_t calls = tp->size > 1 ? 1 : 0;
    CHECK_MSG(c.calls[MT_COLL_ALL_GATHER] == 2 * calls && c.bytes[MT_COLL_ALL_GATHER] == 2 * bytes,
              "all-gathers: %llu calls, %llu B; expected the input and its re-gather",
              (unsigned long long)c.calls[MT_COLL_ALL_GATHER],
              (unsigned long long)c.bytes[MT_COLL_ALL_GATHER]);
    CHECK_MSG(c.calls[MT_COLL_REDUCE_SCATTER] == calls &&
                  c.bytes[MT_COLL_REDUCE_SCATTER] == bytes && c.calls[MT_COLL_ALL_REDUCE] == 0,
              "reduce-scatters: %llu calls, %llu B, all-reduces %llu; expected the input "
              "gradient's reduce-scatter alone",
              (unsigned long long)c.calls[MT_COLL_REDUCE_SCATTER],
              (unsigned long long)c.bytes[MT_COLL_REDUCE_SCATTER],
              (unsigned long long)c.calls[MT_COLL_ALL_REDUCE]);
    CHECK(strcmp(mt_coll_kind_name(MT_COLL_REDUCE_SCATTER), "reduce_scatter") == 0);
    float *bufs[] = {in, w, out, d_in, d_w};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) mt_device_free(dev, bufs[i]);
}

static void test_grad_sum_and_errors(const mt_tp_ctx *tp) {
    float h[3] = {1.0f + (float)tp->rank, 2.0f, -0.5f * (float)tp->rank};
    float *d = up(h, 3);
    CHECK_OK(mt_tp_sequence_grad_sum(tp, d, 3));
    float want[3] = {0};
    for (int r = 0; r < tp->size; r++) {
        want[0] += 1.0f + (float)r;
        want[1] += 2.0f;
        want[2] += -0.5f * (float)r;
    }
    expect_close("gradient sum over tp", d, want, 3);
    mt_device_free(dev, d);
    CHECK_OK(mt_tp_sequence_check(tp, SEQ * tp->size));
    if (tp->size > 1) {
        int seq = 10 % tp->size ? 10 : 2 * tp->size + 1;
        char want_msg[80];
        snprintf(want_msg, sizeof want_msg, "sequence parallelism: seq %d not divisible by tp %d",
                 seq, tp->size);
        expect_error(mt_tp_sequence_check(tp, seq), want_msg);
    }
    expect_error(mt_tp_sequence_check(NULL, 4), "no tp context");
}

int main(int argc, char **argv) {
    mt_runtime *rt = NULL;
    if (mt_init(&rt, &argc, &argv) != MT_OK) {
        fprintf(stderr, "mt_init: %s\n", mt_last_error());
        return 1;
    }
    dev = mt_runtime_device(rt);
    int world = mt_runtime_world_size(rt);
    mt_mesh *mesh = NULL;
    mt_tp_ctx tp;
    const char *names[1] = {"tp"};
    if (N % world != 0 || mt_mesh_create(rt, 1, (int[]){world}, names, &mesh) != MT_OK ||
        mt_tp_context(mesh, &tp) != MT_OK) {
        fprintf(stderr, "world %d (must divide %d rows): %s\n", world, N, mt_last_error());
        mt_finalize(rt);
        return 1;
    }
    int rows = N / world;
    test_column(&tp, rows);
    test_column_gathered(&tp, rows);
    test_row(&tp, rows);
    test_embeddings(&tp, rows);
    test_counters(&tp, rows);
    test_grad_sum_and_errors(&tp);
    /* The sequence-parallel scratch is kept by the context, as large as the largest call's:
     * running every layer again allocates no more and leaves the same block; a context without
     * a kept block (filled in by hand) allocates per call and keeps nothing. */
    mt_mem_stats ms;
    size_t kept = mt_tp_context_scratch_bytes(&tp);
    mt_device_mem_stats(dev, &ms);
    CHECK_MSG(kept > 0 && ms.current[MT_MEM_ACTIVATIONS] == kept,
              "%zu activation bytes allocated, the context keeps %zu",
              ms.current[MT_MEM_ACTIVATIONS], kept);
    mt_device_reset_peaks(dev);
    test_column(&tp, rows);
    test_row(&tp, rows);
    CHECK(mt_tp_context_scratch_bytes(&tp) == kept);
    mt_device_mem_stats(dev, &ms);
    CHECK(ms.current[MT_MEM_ACTIVATIONS] == kept);
    mt_tp_ctx plain = tp;
    plain.scratch = NULL;
    test_row(&plain, rows);
    mt_device_mem_stats(dev, &ms);
    CHECK(ms.current[MT_MEM_ACTIVATIONS] == kept);
    mt_tp_context_release(&tp);
    mt_device_mem_stats(dev, &ms);
    CHECK_MSG(ms.current[MT_MEM_ACTIVATIONS] == 0, "%zu activation bytes left allocated",
              ms.current[MT_MEM_ACTIVATIONS]);
    int rank = mt_runtime_rank(rt);
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    if (rank != 0) return check_failed_ ? 1 : 0;
    return check_report("test_tp_sequence");
}
