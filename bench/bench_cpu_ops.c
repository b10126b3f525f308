/* mt-bench-cpu-ops: the CPU GPT ops (core/cpu/ops_*.c) one by one at train_gpt's shapes.
 *
 *   mt-bench-cpu-ops [--rows 256] [--channels 768] [--heads 12] [--seq 64] [--vocab 256]
 *                    [--reps 20] [--op NAME]
 *
 * Each op runs --reps times after one warm-up on the rank's pool (MT_NUM_THREADS sets its size);
 * the median time is printed, with the median CPU time of the calling thread (all of the op's
 * at MT_NUM_THREADS=1), with the bytes it must move (GB/s: inputs read once, outputs
 * written once; an accumulated output counts twice) or, for attention and the product, its
 * multiply-adds (GFLOP/s), so that each op reads against the memory bandwidth or the sgemm of the
 * same run. The ops' entry points only (mt_op_*) and clock_gettime: the same file built in an
 * older tree gives the before figures of docs/benchmarks.md ("CPU ops").
 *
 * Then the GPT's linears (C -> 3C, C -> C, C -> 4C, 4C -> C, C -> vocab), forward and backward,
 * each with f32 weights (sgemm) and with bf16 weights (mt_op_linear_*_ex: the bf16 product path
 * of this CPU, core/cpu/bf16_gemm_path.h, which MT_CPU_BF16_GEMM forces), timed alternately, and
 * the ratio bf16 / f32 of their medians (docs/benchmarks.md, "bf16 products"). Then the same
 * linears' bf16 backward overwriting d_in, d_w and d_bias (MT_OVERWRITE_*, as FSDP's first
 * writer does) two ways, timed alternately: the flagged outputs zeroed with mt_device_memset and
 * the adding op run on them (what core/ops.c did for the CPU's bf16 products before they took
 * beta 0, and still does on CUDA), and mt_op_linear_backward_into (the "bf16 overwrite" lines).
 *
 * --op runs only the ops whose name contains NAME, and the linears' tables only when NAME is part
 * of "bf16_linears" or "bf16_overwrite" (attention_backward alone at seq 1024 takes seconds; the
 * products at rows 4096 much longer). */
#include "core/ops_internal.h"

#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/ops.h>
#include <meshtrain/status.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROG "mt-bench-cpu-ops"

typedef struct shape {
    long rows, channels, heads, seq, vocab, reps;
    const char *only; /* --op: a substring of the names to run; NULL runs all */
} shape;

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One op bound to its buffers: returns MT_OK or the op's status. */
typedef struct bench_ctx bench_ctx;
typedef mt_status (*op_fn)(bench_ctx *b);

struct bench_ctx {
    mt_device *dev;
    shape s;
    int *ids;
    float *x, *y, *z, *dx, *big, *big2, *big3, *gamma, *beta, *mean, *rstd, *qkv, *d_qkv, *att,
        *w, *dw, *wte, *logits, *d_logits, *mx, *sum, *tl, *loss, *big4, *db;
    uint16_t *half, *w16;
    int lin_in, lin_out; /* the linear the lin_* ops run */
};

#define B_ROWS ((size_t)b->s.rows)
#define B_C ((int)b->s.channels)

static mt_status op_embedding_forward(bench_ctx *b) {
    return mt_op_embedding_forward(b->dev, b->ids, B_ROWS, b->wte, 0, (int)b->s.vocab, B_C, b->y,
                                   false);
}
static mt_status op_embedding_backward(bench_ctx *b) {
    return mt_op_embedding_backward(b->dev, b->ids, B_ROWS, b->x, 0, (int)b->s.vocab, B_C,
                                    b->wte);
}
static mt_status op_position_forward(bench_ctx *b) {
    return mt_op_position_forward(b->dev, b->z, (int)(b->s.rows / b->s.seq), (int)b->s.seq, B_C,
                                  b->y);
}
static mt_status op_position_backward(bench_ctx *b) {
    return mt_op_position_backward(b->dev, b->x, (int)(b->s.rows / b->s.seq), (int)b->s.seq, B_C,
                                   b->z);
}
static mt_status op_layernorm_forward(bench_ctx *b) {
    return mt_op_layernorm_forward(b->dev, b->x, b->gamma, b->beta, B_ROWS, B_C, b->y, b->mean,
                                   b->rstd);
}
static mt_status op_layernorm_backward(bench_ctx *b) {
    return mt_op_layernorm_backward(b->dev, b->y, b->x, b->gamma, b->mean, b->rstd, B_ROWS, B_C,
                                    b->dx, b->z, b->beta + 0);
}
static mt_status op_gelu_forward(bench_ctx *b) {
    return mt_op_gelu_forward(b->dev, b->big, b->big2, B_ROWS * 4 * (size_t)B_C);
}
static mt_status op_gelu_backward(bench_ctx *b) {
    return mt_op_gelu_backward(b->dev, b->big, b->big2, b->big3, B_ROWS * 4 * (size_t)B_C);
}
static mt_status op_add(bench_ctx *b) {
    return mt_op_add(b->dev, b->x, b->y, b->dx, B_ROWS * (size_t)B_C);
}
static mt_status op_attention_forward(bench_ctx *b) {
    return mt_op_attention_forward(b->dev, b->qkv, (int)(b->s.rows / b->s.seq), (int)b->s.seq,
                                   (int)b->s.heads, B_C / (int)b->s.heads, b->y, b->att);
}
static mt_status op_attention_backward(bench_ctx *b) {
    return mt_op_attention_backward(b->dev, b->x, b->qkv, b->att, (int)(b->s.rows / b->s.seq),
                                    (int)b->s.seq, (int)b->s.heads, B_C / (int)b->s.heads,
                                    b->d_qkv);
}
static mt_status op_xent_max(bench_ctx *b) {
    return mt_op_xent_local_max(b->dev, b->logits, B_ROWS, (int)b->s.vocab, b->mx);
}
static mt_status op_xent_sums(bench_ctx *b) {
    return mt_op_xent_local_sums(b->dev, b->logits, b->ids, B_ROWS, 0, (int)b->s.vocab, b->mx,
                                 b->sum, b->tl);
}
static mt_status op_xent_loss_backward(bench_ctx *b) {
    return mt_op_xent_loss_backward(b->dev, b->logits, b->ids, B_ROWS, 0, (int)b->s.vocab, b->mx,
                                    b->sum, b->tl, 1.0f, b->loss, b->d_logits);
}
static mt_status op_cast(bench_ctx *b) {
    return mt_op_cast(b->dev, b->big, MT_F32, b->half, MT_BF16, B_ROWS * 4 * (size_t)B_C);
}
static mt_status op_accumulate(bench_ctx *b) {
    return mt_op_accumulate(b->dev, b->big3, b->half, MT_BF16, B_ROWS * 4 * (size_t)B_C);
}
static mt_status op_linear_forward(bench_ctx *b) {
    return mt_op_linear_forward(b->dev, b->x, b->w, b->gamma, b->big2, (int)b->s.rows, B_C,
                                4 * B_C);
}
static mt_status op_linear_backward(bench_ctx *b) {
    return mt_op_linear_backward(b->dev, b->big3, b->x, b->w, b->dx, b->dw, NULL, (int)b->s.rows,
                                 B_C, 4 * B_C);
}
/* The GPT's linear of lin_in -> lin_out features on rows x lin_in inputs (big), f32 or bf16. */
static mt_status op_lin_f32_forward(bench_ctx *b) {
    return mt_op_linear_forward(b->dev, b->big, b->w, b->gamma, b->big2, (int)b->s.rows,
                                b->lin_in, b->lin_out);
}
static mt_status op_lin_bf16_forward(bench_ctx *b) {
    return mt_op_linear_forward_ex(b->dev, b->big, b->w16, MT_BF16, b->gamma, b->big2,
                                   (int)b->s.rows, b->lin_in, b->lin_out);
}
static mt_status op_lin_f32_backward(bench_ctx *b) {
    return mt_op_linear_backward(b->dev, b->big3, b->big, b->w, b->big4, b->dw, NULL,
                                 (int)b->s.rows, b->lin_in, b->lin_out);
}
static mt_status op_lin_bf16_backward(bench_ctx *b) {
    return mt_op_linear_backward_ex(b->dev, b->big3, b->big, b->w16, MT_BF16, b->big4, b->dw,
                                    NULL, (int)b->s.rows, b->lin_in, b->lin_out);
}
/* The bf16 backward overwriting d_in (big4), d_w and d_bias: zeroed, then added into; or
 * written by the op. */
static mt_status op_lin_bf16_backward_zero_add(bench_ctx *b) {
    size_t rows = (size_t)b->s.rows, fin = (size_t)b->lin_in, fout = (size_t)b->lin_out;
    MT_TRY(mt_device_memset(b->dev, b->big4, 0, rows * fin * sizeof(float), NULL));
    MT_TRY(mt_device_memset(b->dev, b->dw, 0, fout * fin * sizeof(float), NULL));
    MT_TRY(mt_device_memset(b->dev, b->db, 0, fout * sizeof(float), NULL));
    return mt_op_linear_backward_ex(b->dev, b->big3, b->big, b->w16, MT_BF16, b->big4, b->dw,
                                    b->db, (int)b->s.rows, b->lin_in, b->lin_out);
}
static mt_status op_lin_bf16_backward_into(bench_ctx *b) {
    return mt_op_linear_backward_into(b->dev, b->big3, b->big, b->w16, MT_BF16, b->big4, b->dw,
                                      b->db, (int)b->s.rows, b->lin_in, b->lin_out,
                                      MT_OVERWRITE_D_IN | MT_OVERWRITE_D_W | MT_OVERWRITE_D_BIAS);
}

static mt_status op_sum_squares(bench_ctx *b) {
    double acc = 0.0;
    return mt_op_sum_squares(b->dev, b->w, 4 * (size_t)B_C * (size_t)B_C, &acc);
}

/* Times ops[0..n) alternately (one call of each per rep, so that a busy moment of the machine
 * hits them alike) after one warm-up call each; med[i] and cmed[i] get op i's median wall and
 * calling-thread CPU seconds. Returns 0, or 1 after printing the failure. */
static int time_ops(bench_ctx *b, const char *const *names, const op_fn *ops, int n, double *med,
                    double *cmed) {
    size_t reps = (size_t)b->s.reps;
    double *t = malloc(2 * reps * (size_t)n * sizeof *t);
    if (!t) return 1;
    mt_status st = MT_OK;
    int i = 0;
    for (; i < n && st == MT_OK; i++) st = ops[i](b);
    for (size_t r = 0; st == MT_OK && r < reps; r++)
        for (i = 0; i < n && st == MT_OK; i++) {
            double t0 = now_s(), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
            st = ops[i](b);
            t[(size_t)i * reps + r] = now_s() - t0;
            t[((size_t)n + (size_t)i) * reps + r] = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
        }
    if (st != MT_OK) {
        fprintf(stderr, PROG ": %s: %s: %s\n", names[i - 1], mt_status_str(st), mt_last_error());
        free(t);
        return 1;
    }
    for (i = 0; i < 2 * n; i++) {
        qsort(t + (size_t)i * reps, reps, sizeof *t, cmp_double);
        (i < n ? med : cmed)[i % n] = t[(size_t)i * reps + reps / 2];
    }
    free(t);
    return 0;
}

/* Times op; prints its median and rate (bytes moved, or flops when flops > 0). */
static int run(bench_ctx *b, const char *name, op_fn op, double bytes, double flops) {
    if (b->s.only && !strstr(name, b->s.only)) return 0;
    double med, cmed;
    /* cmed: the calling thread's CPU time: the whole op's at MT_NUM_THREADS=1, and far less
     * noisy than the wall time on a loaded machine. */
    if (time_ops(b, &name, &op, 1, &med, &cmed)) return 1;
    if (flops > 0)
        printf("op %-22s %9.1f us %9.1f us-cpu %8.2f GFLOP/s\n", name, med * 1e6, cmed * 1e6,
               flops / med * 1e-9);
    else
        printf("op %-22s %9.1f us %9.1f us-cpu %8.2f GB/s\n", name, med * 1e6, cmed * 1e6,
               bytes / med * 1e-9);
    return 0;
}

/* The GPT's linears, as the tables below name them: in -> out features of linear i. */
#define GPT_LINEARS 5
static const char *const linear_names[GPT_LINEARS] = {"C->3C", "C->C", "C->4C", "4C->C",
                                                      "C->vocab"};

static void use_linear(bench_ctx *b, int i) {
    int c = (int)b->s.channels, v = (int)b->s.vocab;
    const int shapes[GPT_LINEARS][2] = {{c, 3 * c}, {c, c}, {c, 4 * c}, {4 * c, c}, {c, v}};
    b->lin_in = shapes[i][0], b->lin_out = shapes[i][1];
}

/* The GPT's linears with f32 and with bf16 weights: per linear and direction the medians, the
 * bf16 one's GFLOP/s and the ratio bf16 / f32 (wall, and calling-thread CPU); then the ratio of
 * the sums over all of them, one training step's products. */
static int run_linears(bench_ctx *b) {
    if (b->s.only && !strstr("bf16_linears", b->s.only)) return 0;
    double sum32 = 0.0, sum16 = 0.0;
    printf("# bf16 products: %-9s %-8s %10s %10s %9s %10s %10s\n", "linear", "pass", "f32_us",
           "bf16_us", "bf16/f32", "cpu_ratio", "bf16_GF/s");
    for (int i = 0; i < GPT_LINEARS; i++) {
        use_linear(b, i);
        double macs = (double)b->s.rows * (double)b->lin_in * (double)b->lin_out;
        for (int pass = 0; pass < 2; pass++) {
            static const char *const op_names[2][2] = {
                {"linear_forward", "linear_forward_ex bf16"},
                {"linear_backward", "linear_backward_ex bf16"}};
            const op_fn ops[2][2] = {{op_lin_f32_forward, op_lin_bf16_forward},
                                     {op_lin_f32_backward, op_lin_bf16_backward}};
            double med[2], cmed[2];
            if (time_ops(b, op_names[pass], ops[pass], 2, med, cmed)) return 1;
            double flops = 2.0 * macs * (pass ? 2.0 : 1.0);
            printf("bf16 linear %-9s %-8s %10.1f %10.1f %9.3f %10.3f %10.1f\n", linear_names[i],
                   pass ? "backward" : "forward", med[0] * 1e6, med[1] * 1e6, med[1] / med[0],
                   cmed[1] / cmed[0], flops / med[1] * 1e-9);
            sum32 += med[0], sum16 += med[1];
        }
    }
    printf("bf16 linears all: f32 %.1f us, bf16 %.1f us, bf16/f32 %.3f\n", sum32 * 1e6,
           sum16 * 1e6, sum16 / sum32);
    return 0;
}

/* The GPT's linears' bf16 backward overwriting its three outputs: zeroed then added into
 * against written with beta 0, per linear the medians and their ratio (wall, and calling-thread
 * CPU), then the ratio of the sums. */
static int run_overwrite(bench_ctx *b) {
    if (b->s.only && !strstr("bf16_overwrite", b->s.only)) return 0;
    static const char *const op_names[2] = {"zeroed + linear_backward_ex bf16",
                                            "linear_backward_into bf16"};
    const op_fn ops[2] = {op_lin_bf16_backward_zero_add, op_lin_bf16_backward_into};
    double sum_zero = 0.0, sum_into = 0.0;
    printf("# bf16 overwrite: %-9s %12s %10s %10s %10s\n", "linear", "zero_add_us", "into_us",
           "into/zero", "cpu_ratio");
    for (int i = 0; i < GPT_LINEARS; i++) {
        use_linear(b, i);
        double med[2], cmed[2];
        if (time_ops(b, op_names, ops, 2, med, cmed)) return 1;
        printf("bf16 overwrite %-9s %12.1f %10.1f %10.3f %10.3f\n", linear_names[i], med[0] * 1e6,
               med[1] * 1e6, med[1] / med[0], cmed[1] / cmed[0]);
        sum_zero += med[0], sum_into += med[1];
    }
    printf("bf16 overwrite all: zeroed + add %.1f us, into %.1f us, into/zero %.3f\n",
           sum_zero * 1e6, sum_into * 1e6, sum_into / sum_zero);
    return 0;
}

static int bad(const char *opt, const char *value) {
    fprintf(stderr, PROG ": bad option %s%s%s (see the header of bench/bench_cpu_ops.c)\n", opt,
            value ? " " : "", value ? value : "");
    return 2;
}

static int parse(int argc, char **argv, shape *s) {
    *s = (shape){256, 768, 12, 64, 256, 20, NULL};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--op") == 0 && i + 1 < argc) {
            s->only = argv[++i];
            continue;
        }
        static const char *const names[] = {"--rows", "--channels", "--heads", "--seq",
                                            "--vocab", "--reps"};
        long *fields[] = {&s->rows, &s->channels, &s->heads, &s->seq, &s->vocab, &s->reps};
        int k = 0;
        while (k < 6 && strcmp(argv[i], names[k]) != 0) k++;
        if (k == 6 || i + 1 >= argc) return bad(argv[i], NULL);
        char *end = NULL;
        long v = strtol(argv[++i], &end, 10);
        if (!*argv[i] || *end || v < 1 || v > (1L << 24)) return bad(argv[i - 1], argv[i]);
        *fields[k] = v;
    }
    if (s->rows % s->seq || s->channels % s->heads)
        return bad("--rows/--channels", "rows must be a multiple of seq, channels of heads");
    return 0;
}

static float *filled(size_t n, uint64_t *rng) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; p && i < n; i++) {
        *rng = *rng * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = (float)((double)(*rng >> 40) / (double)(1ULL << 24) * 2.0 - 1.0);
    }
    return p;
}

int main(int argc, char **argv) {
    shape s;
    int rc = parse(argc, argv, &s);
    if (rc) return rc;
    bench_ctx b = {.s = s};
    if (mt_device_open_cpu(0, &b.dev) != MT_OK) {
        fprintf(stderr, PROG ": opening the CPU device: %s\n", mt_last_error());
        return 1;
    }
    uint64_t rng = 42;
    size_t r = (size_t)s.rows, c = (size_t)s.channels, v = (size_t)s.vocab;
    size_t nb = r / (size_t)s.seq, t = (size_t)s.seq, nh = (size_t)s.heads;
    b.ids = malloc(r * sizeof *b.ids);
    for (size_t i = 0; b.ids && i < r; i++) b.ids[i] = (int)((i * 7919) % v);
    b.x = filled(r * c, &rng), b.y = filled(r * c, &rng), b.z = filled(r * c, &rng);
    b.dx = filled(r * c, &rng), b.big = filled(r * 4 * c, &rng), b.big2 = filled(r * 4 * c, &rng);
    b.big3 = filled(r * 4 * c, &rng), b.gamma = filled(4 * c, &rng), b.beta = filled(c, &rng);
    b.mean = filled(r, &rng), b.rstd = filled(r, &rng), b.qkv = filled(r * 3 * c, &rng);
    b.d_qkv = filled(r * 3 * c, &rng), b.att = filled(nb * nh * t * t, &rng);
    /* The weights: up to 4C x C, or C x vocab for the linears below. */
    size_t wmax = 4 * c * c > c * v ? 4 * c * c : c * v;
    b.w = filled(wmax, &rng), b.dw = filled(wmax, &rng), b.wte = filled(v * c, &rng);
    b.logits = filled(r * v, &rng);
    b.d_logits = filled(r * v, &rng), b.mx = filled(r, &rng), b.sum = filled(r, &rng);
    b.tl = filled(r, &rng), b.loss = filled(r, &rng);
    b.half = malloc(r * 4 * c * sizeof *b.half);
    /* The linears' input gradients (up to rows x 4C) and bf16 weights. */
    b.big4 = filled(r * 4 * c, &rng), b.db = filled(4 * c, &rng);
    b.w16 = malloc(wmax * sizeof *b.w16);
    if (b.w16) mt_f32_to_bf16_array(b.w, b.w16, wmax);
    /* and the bias (gamma) up to vocab; rows x vocab outputs fit big2 while vocab <= 4C */
    if (v > 4 * c) {
        fprintf(stderr, PROG ": --vocab above 4 x --channels is not measured\n");
        return 2;
    }
    if (!b.ids || !b.x || !b.y || !b.z || !b.dx || !b.big || !b.big2 || !b.big3 || !b.gamma ||
        !b.beta || !b.mean || !b.rstd || !b.qkv || !b.d_qkv || !b.att || !b.w || !b.dw || !b.wte ||
        !b.logits || !b.d_logits || !b.mx || !b.sum || !b.tl || !b.loss || !b.half || !b.w16 ||
        !b.big4 || !b.db) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    const char *threads = getenv("MT_NUM_THREADS");
    printf("rows %zu channels %zu heads %zu seq %zu vocab %zu reps %ld threads %s\n", r, c, nh, t,
           v, s.reps, threads ? threads : "(default)");
    double f = 4.0, rc_b = (double)(r * c) * f, big_b = rc_b * 4.0;
    /* causal attention: QK^T and att V over about half of the T x T scores, 2 flops a madd */
    double att_flops = 2.0 * 2.0 * (double)nb * (double)nh * (double)(t * (t + 1) / 2) *
                       (double)(c / nh);
    int fail = 0;
    fail |= run(&b, "embedding_forward", op_embedding_forward, 2 * rc_b, 0);
    fail |= run(&b, "embedding_backward", op_embedding_backward, 3 * rc_b, 0);
    fail |= run(&b, "position_forward", op_position_forward, 2 * rc_b, 0);
    fail |= run(&b, "position_backward", op_position_backward, rc_b + 2 * f * (double)(t * c), 0);
    fail |= run(&b, "layernorm_forward", op_layernorm_forward, 2 * rc_b, 0);
    fail |= run(&b, "layernorm_backward", op_layernorm_backward, 4 * rc_b, 0);
    fail |= run(&b, "gelu_forward", op_gelu_forward, 2 * big_b, 0);
    fail |= run(&b, "gelu_backward", op_gelu_backward, 4 * big_b, 0);
    fail |= run(&b, "add", op_add, 3 * rc_b, 0);
    fail |= run(&b, "attention_forward", op_attention_forward, 0, att_flops);
    fail |= run(&b, "attention_backward", op_attention_backward, 0, 2.0 * att_flops);
    double lv = (double)(r * v) * f;
    fail |= run(&b, "xent_local_max", op_xent_max, lv, 0);
    fail |= run(&b, "xent_local_sums", op_xent_sums, lv, 0);
    fail |= run(&b, "xent_loss_backward", op_xent_loss_backward, 3 * lv, 0);
    fail |= run(&b, "cast_f32_bf16", op_cast, big_b * 1.5, 0);
    fail |= run(&b, "accumulate_bf16", op_accumulate, big_b * 2.5, 0);
    fail |= run(&b, "linear_forward_sgemm", op_linear_forward, 0,
                2.0 * (double)r * (double)c * 4.0 * (double)c);
    fail |= run(&b, "linear_backward_sgemm", op_linear_backward, 0,
                4.0 * (double)r * (double)c * 4.0 * (double)c);
    fail |= run(&b, "sum_squares_4CxC", op_sum_squares, f * 4.0 * (double)(c * c), 0);
    fail |= run_linears(&b);
    fail |= run_overwrite(&b);
    mt_device_close(b.dev);
    return fail;
}
