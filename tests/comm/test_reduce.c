/* The reduction kernels of the host collectives: f32/bf16 sum and max, avg scaling in the final
 * step only, one bf16 rounding per hop, agreement with core/dtype.c's conversion, and the sums of
 * squares taken as the outputs are written. */
#include "check.h"

#include "comm/reduce.h"
#include "core/cpu/sum_squares.h"

#include <math.h>
#include <meshtrain/dtype.h>
#include <stdint.h>
#include <string.h>

static void test_f32_pair(void) {
    float a[5] = {1, 2, -3, 0.5f, 100}, b[5] = {4, -2, -3, 0.25f, -50}, d[5];
    mt_reduce_pair(MT_F32, MT_REDUCE_SUM, false, 4, d, a, b, 5);
    CHECK(d[0] == 5 && d[1] == 0 && d[2] == -6 && d[3] == 0.75f && d[4] == 50);
    /* avg divides only in the final step */
    mt_reduce_pair(MT_F32, MT_REDUCE_AVG, false, 4, d, a, b, 5);
    CHECK(d[0] == 5 && d[4] == 50);
    mt_reduce_pair(MT_F32, MT_REDUCE_AVG, true, 4, d, a, b, 5);
    CHECK(d[0] == 1.25f && d[2] == -1.5f && d[4] == 12.5f);
    mt_reduce_pair(MT_F32, MT_REDUCE_MAX, true, 4, d, a, b, 5);
    CHECK(d[0] == 4 && d[1] == 2 && d[2] == -3 && d[3] == 0.5f && d[4] == 100);
    /* in place */
    mt_reduce_pair(MT_F32, MT_REDUCE_SUM, false, 2, a, a, b, 5);
    CHECK(a[0] == 5 && a[4] == 50);
    /* NaN propagates through max from either side */
    float n1[2] = {NAN, 1}, n2[2] = {1, NAN};
    mt_reduce_pair(MT_F32, MT_REDUCE_MAX, true, 2, d, n1, n2, 2);
    CHECK(isnan(d[0]) && isnan(d[1]));
}

static mt_bf16 bf(float x) { return mt_f32_to_bf16(x); }
static float fl(mt_bf16 x) { return mt_bf16_to_f32(x); }

static void test_bf16_pair(void) {
    /* 256 + 1 = 257 is not a bf16: one rounding (ties to even) gives 256. */
    mt_bf16 a[3] = {bf(256), bf(1), bf(-2)}, b[3] = {bf(1), bf(2), bf(-2)}, d[3];
    mt_reduce_pair(MT_BF16, MT_REDUCE_SUM, false, 2, d, a, b, 3);
    CHECK(fl(d[0]) == 256 && fl(d[1]) == 3 && fl(d[2]) == -4);
    /* avg: (1 + 2) / 3 computed in f32, rounded once */
    mt_reduce_pair(MT_BF16, MT_REDUCE_AVG, true, 3, d, a, b, 3);
    CHECK(d[1] == bf((1.0f + 2.0f) / 3.0f));
    mt_reduce_pair(MT_BF16, MT_REDUCE_MAX, true, 3, d, a, b, 3);
    CHECK(fl(d[0]) == 256 && fl(d[1]) == 2 && fl(d[2]) == -2);

    /* Per-hop rounding: a 3-hop ring sum rounds after every hop, which differs from rounding the
     * exact f32 sum once. 256 + 1 -> 256, + 1 -> 256, versus 258 exactly. */
    mt_bf16 acc = bf(256), one = bf(1);
    mt_reduce_pair(MT_BF16, MT_REDUCE_SUM, false, 3, &acc, &acc, &one, 1);
    mt_reduce_pair(MT_BF16, MT_REDUCE_SUM, true, 3, &acc, &acc, &one, 1);
    CHECK(fl(acc) == 256);
    const void *inputs[3] = {&(mt_bf16){bf(256)}, &one, &one};
    mt_bf16 once;
    mt_reduce_many(MT_BF16, MT_REDUCE_SUM, 3, inputs, &once, 1);
    CHECK(fl(once) == 258);
}

/* The kernel's inline bf16 rounding must be the library's conversion. */
static void test_bf16_rounding_matches_dtype(void) {
    mt_bf16 one = bf(1), tiny = bf(0.00390625f), odd = bf(1.0078125f), d;
    /* exact ties: 1 + 2^-8 rounds to even (1), 1.0078125 + 2^-8 rounds up to even (1.015625) */
    mt_reduce_pair(MT_BF16, MT_REDUCE_SUM, false, 2, &d, &one, &tiny, 1);
    CHECK(fl(d) == 1.0f);
    mt_reduce_pair(MT_BF16, MT_REDUCE_SUM, false, 2, &d, &odd, &tiny, 1);
    CHECK(fl(d) == 1.015625f);
    /* overflow to infinity, NaN stays NaN */
    mt_bf16 big = 0x7f7f, nan = 0x7fc0;
    mt_reduce_pair(MT_BF16, MT_REDUCE_SUM, false, 2, &d, &big, &big, 1);
    CHECK(isinf(fl(d)) && fl(d) > 0);
    mt_reduce_pair(MT_BF16, MT_REDUCE_SUM, false, 2, &d, &nan, &one, 1);
    CHECK(isnan(fl(d)));
    mt_reduce_pair(MT_BF16, MT_REDUCE_MAX, false, 2, &d, &one, &nan, 1);
    CHECK(isnan(fl(d)));

    /* Sums whose exact f32 value needs rounding: compare with mt_f32_to_bf16 of the f32 sum. */
    int bad = 0;
    for (int i = 0; i < 4096; i++) {
        float x = (float)(i * 37 % 1000) * 0.37f + 1.0f, y = (float)(i % 97) * 1.9f;
        mt_bf16 a = bf(x), b = bf(y);
        mt_reduce_pair(MT_BF16, MT_REDUCE_SUM, false, 2, &d, &a, &b, 1);
        if (d != mt_f32_to_bf16(fl(a) + fl(b))) bad++;
        mt_reduce_pair(MT_BF16, MT_REDUCE_AVG, true, 3, &d, &a, &b, 1);
        if (d != mt_f32_to_bf16((fl(a) + fl(b)) / 3.0f)) bad++;
    }
    CHECK_MSG(bad == 0, "%d mismatches with mt_f32_to_bf16", bad);
}

static void test_many(void) {
    /* A size past the kernel's internal block, in place on the first input. */
    enum { N = 3000 };
    static float x[N], y[N], z[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)(i % 7);
        y[i] = (float)(i % 5);
        z[i] = (float)(i % 3);
    }
    const void *in[3] = {x, y, z};
    mt_reduce_many(MT_F32, MT_REDUCE_AVG, 3, in, x, N);
    int bad = 0;
    for (int i = 0; i < N; i++)
        if (x[i] != (float)(i % 7 + i % 5 + i % 3) / 3.0f) bad++;
    CHECK_MSG(bad == 0, "%d wrong f32 avg elements", bad);
    for (int i = 0; i < N; i++) x[i] = (float)(i % 7) - 3;
    mt_reduce_many(MT_F32, MT_REDUCE_MAX, 3, in, z, N);
    bad = 0;
    for (int i = 0; i < N; i++) {
        float m = fmaxf(fmaxf((float)(i % 7) - 3, (float)(i % 5)), (float)(i % 3));
        if (z[i] != m) bad++;
    }
    CHECK_MSG(bad == 0, "%d wrong f32 max elements", bad);
    mt_reduce_many(MT_F32, MT_REDUCE_SUM, 0, in, z, 0); /* count 0 touches nothing */
}

/* Final outputs of 256 KiB and more take the streaming stores where the destination is 16-byte
 * aligned (comm/reduce.c): the same values as the plain loops, aligned and from a destination
 * that starts off a 16-byte boundary (ordinary stores), in place on an input, with a tail that
 * is not a whole vector, and nothing written outside the output. */
static void test_streamed_outputs(void) {
    enum { N = 70001, PAD = 16 };
    static float a[N + PAD], b[N + PAD], c[N + PAD];
    static _Alignas(64) float d[N + 2 * PAD];
    for (int i = 0; i < N + PAD; i++) {
        a[i] = (float)(i % 11) * 0.25f;
        b[i] = (float)(i % 13) - 6.0f;
        c[i] = (float)(i % 3) * 1.5f;
    }
    for (int i = 0; i < N + 2 * PAD; i++) d[i] = -99.0f;
    float *out = d + 1; /* 4 bytes past whatever alignment d has */
    mt_reduce_pair(MT_F32, MT_REDUCE_SUM, true, 2, out, a + 1, b + 1, N);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += out[i] != a[i + 1] + b[i + 1];
    bad += d[0] != -99.0f;
    for (int i = N + 1; i < N + 2 * PAD; i++) bad += d[i] != -99.0f;
    CHECK_MSG(bad == 0, "%d wrong elements in a streamed f32 sum", bad);
    for (int wide = 0; wide <= 1; wide++) { /* 16-byte stores, then AVX-512's where it runs */
        mt_reduce_use_avx512(wide);
        for (int i = 0; i < N + 2 * PAD; i++) d[i] = -99.0f;
        mt_reduce_pair(MT_F32, MT_REDUCE_SUM, true, 2, d + 16, a, b, N); /* 64-byte aligned */
        bad = 0;
        for (int i = 0; i < N; i++) bad += d[i + 16] != a[i] + b[i];
        for (int i = 0; i < 16; i++) bad += d[i] != -99.0f;
        for (int i = N + 16; i < N + 2 * PAD; i++) bad += d[i] != -99.0f;
        CHECK_MSG(bad == 0, "wide %d: %d wrong elements in an aligned streamed f32 sum", wide,
                  bad);
    }
    mt_reduce_use_avx512(-1);
    mt_reduce_pair(MT_F32, MT_REDUCE_AVG, true, 3, out, a + 1, b + 1, N);
    bad = 0;
    for (int i = 0; i < N; i++) bad += out[i] != (a[i + 1] + b[i + 1]) / 3.0f;
    CHECK_MSG(bad == 0, "%d wrong elements in a streamed f32 avg", bad);
    /* In place on its first input. */
    static float acc[N];
    for (int i = 0; i < N; i++) acc[i] = a[i];
    mt_reduce_pair(MT_F32, MT_REDUCE_SUM, true, 2, acc, acc, b, N);
    bad = 0;
    for (int i = 0; i < N; i++) bad += acc[i] != a[i] + b[i];
    CHECK_MSG(bad == 0, "%d wrong elements in a streamed in-place sum", bad);
    /* Many inputs, in place on the second, off alignment. */
    for (int i = 0; i < N + PAD; i++) b[i] = (float)(i % 13) - 6.0f;
    const void *in[3] = {a + 3, b + 3, c + 3};
    mt_reduce_many(MT_F32, MT_REDUCE_SUM, 3, in, b + 3, N);
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += b[i + 3] != (a[i + 3] + ((float)((i + 3) % 13) - 6.0f)) + c[i + 3];
    for (int i = N + 3; i < N + PAD; i++) bad += b[i] != (float)(i % 13) - 6.0f;
    CHECK_MSG(bad == 0, "%d wrong elements in a streamed sum of 3 inputs", bad);
}

/* The sums of squares the reduce-scatter takes as it writes (mt_reduce_*_squares): every output
 * element the bits of the plain sum in input order (then divided), every chunk's partial the
 * bits of the chunk kernel over the output, partials past sq.count untouched; over several
 * chunks with a tail that is neither a whole vector nor a whole block, values whose squares span
 * the doubles' exponents (a change of order shows), 2 to 5 inputs, aligned, off alignment and in
 * place; and mt_reduce_squares_of's pass the same partials. wide: the AVX-512 kernel allowed
 * (it runs where the CPU has AVX-512F; a block counted in part takes the other path). */
static void squares_once(int wide) {
    enum { N = 3 * MT_SQ_CHUNK + 1000 + 7, CH = (N + MT_SQ_CHUNK - 1) / MT_SQ_CHUNK, K = 5 };
    static _Alignas(64) float in[K][N + 16], out[N + 16], want[N], saved[N + 16];
    uint32_t rng = 12345u;
    for (int j = 0; j < K; j++)
        for (int i = 0; i < N + 16; i++) {
            rng = rng * 1664525u + 1013904223u;
            float v = (float)(rng >> 8) / 16777216.0f - 0.5f;
            in[j][i] = i % 3 == 0 ? v * 1e15f : i % 5 == 1 ? v * 1e-15f : v;
        }
    mt_sum_squares_chunk_fn chunk = mt_sum_squares_chunk_pick();
    for (int k = 2; k <= K; k++)
        for (int shape = 0; shape < 3; shape++) { /* aligned, off by one float, in place */
            size_t off = shape == 1 ? 1 : 0, count = shape == 2 ? N - 5000 : N;
            const void *inputs[K];
            for (int j = 0; j < k; j++) inputs[j] = in[j] + off;
            for (size_t i = 0; i < N; i++) {
                float v = in[0][i + off];
                for (int j = 1; j < k; j++) v += in[j][i + off];
                want[i] = k == 2 ? v / 3.0f : v / (float)k;
            }
            double partial[CH + 1];
            for (int c = 0; c <= CH; c++) partial[c] = -1.0;
            mt_reduce_squares sq = {partial, count};
            float *dst = shape == 2 ? in[1] + off : out + off;
            memcpy(saved, in[1], sizeof saved);
            if (k == 2) /* the ring's final step: avg over a group of 3 */
                mt_reduce_pair_squares(MT_REDUCE_AVG, 3, dst, in[0] + off, in[1] + off, N, &sq);
            else
                mt_reduce_many_squares(MT_REDUCE_AVG, k, inputs, dst, N, &sq);
            int bad = memcmp(dst, want, sizeof want) != 0, bad_sq = 0;
            size_t chunks = (count + MT_SQ_CHUNK - 1) / MT_SQ_CHUNK;
            for (size_t c = 0; c < chunks; c++) {
                size_t len = count - c * MT_SQ_CHUNK < MT_SQ_CHUNK ? count - c * MT_SQ_CHUNK
                                                                   : MT_SQ_CHUNK;
                double w = chunk(want + c * MT_SQ_CHUNK, len);
                bad_sq += memcmp(&w, &partial[c], sizeof w) != 0;
            }
            for (size_t c = chunks; c <= CH; c++) bad_sq += partial[c] != -1.0;
            CHECK_MSG(!bad && !bad_sq, "wide %d, %d inputs, shape %d: output %s, %d partial sums "
                      "wrong", wide, k, shape, bad ? "wrong" : "right", bad_sq);
            double again[CH + 1];
            memcpy(again, partial, sizeof again);
            mt_reduce_squares_of(dst, &(mt_reduce_squares){again, count});
            CHECK_MSG(memcmp(again, partial, sizeof again) == 0,
                      "wide %d, %d inputs, shape %d: the pass after differs from the sums taken",
                      wide, k, shape);
            memcpy(in[1], saved, sizeof saved); /* in place overwrote it */
        }
}

static void test_squares(void) {
    for (int wide = 0; wide <= 1; wide++) { /* SSE2 sums and lanes, then the AVX-512 kernel */
        mt_reduce_use_avx512(wide);
        squares_once(wide);
    }
    mt_reduce_use_avx512(-1);
}

int main(void) {
    test_f32_pair();
    test_bf16_pair();
    test_bf16_rounding_matches_dtype();
    test_many();
    test_streamed_outputs();
    test_squares();
    return check_report("test_reduce");
}
