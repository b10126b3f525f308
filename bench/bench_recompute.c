/* mt-bench-recompute: what activation recompute costs a GPT step, and why.
 *
 *   mt-bench-recompute [--layers 4] [--d-model 128] [--heads 4] [--seq 128] [--batch 4]
 *                      [--rounds 10]
 *
 * One process, FSDP over a mesh of one rank (no communication: the cost measured is compute).
 * Each round times, one after the other on the same model and tokens, each ending when the
 * device is idle:
 *   fwd   mt_gpt_forward (the blocks' forward is what recompute runs a second time),
 *   none  mt_gpt_forward_backward without recompute,
 *   full  mt_gpt_forward_backward with every block recomputing (mt_recompute_enable),
 * and prints the minimum and median wall time over --rounds of each, the median CPU time of
 * the process (on a CPU device the compute alone, robust to other programs on the machine),
 * full / none, and the bound
 *   full <= none + fwd (fwd includes the head's forward, which is not re-run),
 * so a ratio above the goal (1.4) is explained by the forward's share of the step. The
 * activation peak of a none and a full step is printed too. Rounds interleave the three so that
 * a busy moment of the machine slows all of them. On a shared machine run it with
 * OPENBLAS_NUM_THREADS=1: the CPU time is then the compute alone (with threads, OpenBLAS's
 * yielding workers add to it).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <meshtrain/meshtrain.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROG "mt-bench-recompute"

typedef struct options {
    int layers, d_model, heads, seq, batch, rounds;
} options;

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.layers = 4, .d_model = 128, .heads = 4, .seq = 128, .batch = 4,
                   .rounds = 10};
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i];
        int *dst = !strcmp(argv[i], "--layers")    ? &o->layers
                   : !strcmp(argv[i], "--d-model") ? &o->d_model
                   : !strcmp(argv[i], "--heads")   ? &o->heads
                   : !strcmp(argv[i], "--seq")     ? &o->seq
                   : !strcmp(argv[i], "--batch")   ? &o->batch
                   : !strcmp(argv[i], "--rounds")  ? &o->rounds
                                                   : NULL;
        if (!dst || i + 1 >= argc || (*dst = atoi(argv[++i])) < 1) {
            fprintf(stderr, PROG ": bad option %s%s%s (--layers, --d-model, --heads, --seq, "
                            "--batch, --rounds take an integer >= 1)\n", name,
                    argv[i] != name ? " " : "", argv[i] != name ? argv[i] : "");
            return -1;
        }
    }
    return 0;
}

static double now_ms(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { FWD, NONE, FULL, KINDS };

/* One timed call of kind k (recompute switched on for FULL only): its wall time, the CPU time
 * of the process (on a CPU device: the compute, whatever else the machine runs) and its
 * activation peak. */
static mt_status timed(mt_gpt *g, const options *o, const int *tokens, int k, double *ms,
                       double *cpu_ms, size_t *peak) {
    mt_device *dev = mt_runtime_device(mt_mesh_runtime(mt_module_mesh(mt_gpt_root(g))));
    for (int l = 0; l < o->layers; l++) {
        mt_module *b = mt_gpt_block(g, l);
        if (k == FULL && !mt_recompute_enabled(b)) MT_TRY(mt_recompute_enable(b));
        if (k != FULL && mt_recompute_enabled(b)) MT_TRY(mt_recompute_disable(b));
    }
    MT_TRY(mt_device_synchronize(dev));
    mt_device_reset_peaks(dev);
    float loss;
    double t0 = now_ms(CLOCK_MONOTONIC), c0 = now_ms(CLOCK_PROCESS_CPUTIME_ID);
    if (k == FWD) MT_TRY(mt_gpt_forward(g, tokens, o->batch, &loss));
    else MT_TRY(mt_gpt_forward_backward(g, tokens, o->batch, 1.0f, &loss));
    MT_TRY(mt_device_synchronize(dev));
    *ms = now_ms(CLOCK_MONOTONIC) - t0;
    *cpu_ms = now_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
    mt_mem_stats s;
    mt_device_mem_stats(dev, &s);
    *peak = s.peak[MT_MEM_ACTIVATIONS];
    return k == FWD ? MT_OK : mt_zero_grad(mt_gpt_root(g));
}

static mt_status run(mt_runtime *rt, const options *o) {
    mt_mesh *mesh = NULL;
    mt_gpt *g = NULL;
    double *ms[KINDS] = {0}, *cpu[KINDS] = {0};
    size_t peak[KINDS] = {0};
    int *tokens = malloc((size_t)o->batch * (size_t)(o->seq + 1) * sizeof *tokens);
    bool ok = tokens != NULL;
    for (int k = 0; k < KINDS; k++) {
        ms[k] = calloc((size_t)o->rounds, sizeof(double));
        cpu[k] = calloc((size_t)o->rounds, sizeof(double));
        ok = ok && ms[k] && cpu[k];
    }
    mt_status st = ok ? MT_OK : MT_ERR_OUT_OF_MEMORY;
    if (st != MT_OK) fprintf(stderr, PROG ": out of host memory\n");
    for (int i = 0; tokens && i < o->batch * (o->seq + 1); i++) tokens[i] = (i * 31 + i / 7) % 256;
    mt_gpt_config cfg = {.layers = o->layers, .d_model = o->d_model, .heads = o->heads,
                         .seq = o->seq, .vocab = 256, .seed = 1};
    if (st == MT_OK) st = mt_mesh_create(rt, 1, (int[]){1}, (const char *[]){"dp"}, &mesh);
    if (st == MT_OK) st = mt_gpt_create(mesh, &cfg, &g);
    mt_fsdp_options fo = mesh ? mt_fsdp_defaults(mesh, "dp") : (mt_fsdp_options){0};
    for (int l = 0; st == MT_OK && l < o->layers; l++) st = mt_fsdp_shard(mt_gpt_block(g, l), &fo);
    if (st == MT_OK) st = mt_fsdp_shard(mt_gpt_root(g), &fo);
    double warm, warm_cpu;
    size_t unused;
    for (int k = 0; st == MT_OK && k < KINDS; k++)
        st = timed(g, o, tokens, k, &warm, &warm_cpu, &unused);
    for (int r = 0; st == MT_OK && r < o->rounds; r++)
        for (int k = 0; st == MT_OK && k < KINDS; k++)
            st = timed(g, o, tokens, k, &ms[k][r], &cpu[k][r], &peak[k]);
    if (st == MT_OK) {
        double lo[KINDS], med[KINDS], c[KINDS];
        for (int k = 0; k < KINDS; k++) {
            qsort(ms[k], (size_t)o->rounds, sizeof(double), cmp_double);
            qsort(cpu[k], (size_t)o->rounds, sizeof(double), cmp_double);
            lo[k] = ms[k][0];
            med[k] = ms[k][o->rounds / 2];
            c[k] = cpu[k][o->rounds / 2];
        }
        printf("GPT %d layers, d_model %d, %d heads, seq %d, batch %d; %d rounds (wall min / "
               "wall median / process CPU median, ms)\n", o->layers, o->d_model, o->heads, o->seq,
               o->batch, o->rounds);
        printf("  forward only          %9.2f / %9.2f / %9.2f\n", lo[FWD], med[FWD], c[FWD]);
        printf("  step, no recompute    %9.2f / %9.2f / %9.2f   activation peak %zu bytes\n",
               lo[NONE], med[NONE], c[NONE], peak[NONE]);
        printf("  step, full recompute  %9.2f / %9.2f / %9.2f   activation peak %zu bytes\n",
               lo[FULL], med[FULL], c[FULL], peak[FULL]);
        printf("  full / none           %9.3f / %9.3f / %9.3f   (CPU: forward / step without "
               "%.3f, so expected <= %.3f)\n", lo[FULL] / lo[NONE], med[FULL] / med[NONE],
               c[FULL] / c[NONE], c[FWD] / c[NONE], 1.0 + c[FWD] / c[NONE]);
    }
    if (st != MT_OK && mt_last_error()[0]) fprintf(stderr, PROG ": %s\n", mt_last_error());
    mt_gpt_destroy(g);
    mt_mesh_destroy(mesh);
    for (int k = 0; k < KINDS; k++) {
        free(ms[k]);
        free(cpu[k]);
    }
    free(tokens);
    return st;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o) != 0) return 2;
    mt_runtime *rt = NULL;
    if (mt_init(&rt, NULL, NULL) != MT_OK) {
        fprintf(stderr, PROG ": %s\n", mt_last_error());
        return 1;
    }
    mt_status st = run(rt, &o);
    mt_finalize(rt);
    return st == MT_OK ? 0 : 1;
}
