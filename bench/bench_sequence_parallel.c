/* Sequence parallelism's cost and saving on the GPT (run through mtrun; every rank one tp rank):
 *
 *   mtrun --standalone --nproc_per_node T mt-bench-sequence-parallel [--layers L] [--d-model C]
 *         [--heads H] [--seq S] [--batch B]
 *
 * For the model without and with config.sequence_parallel, rank 0 reports:
 *   the bytes of the activations sequence parallelism splits, from the shapes the model
 *   allocates (per block ln_1, ln_2 with their means and rstds, the two residual sums; the
 *   embedding output; ln_f with its mean and rstd), which must drop to 1 / tp;
 *   the device's activation peak (MT_MEM_ACTIVATIONS) of a forward and of a forward-backward,
 *   measured;
 *   the tp group's collectives in one forward-backward (mt_group_counters), and the bytes a ring
 *   sends per rank from them: 2 (p-1)/p of an all-reduce's payload, (p-1)/p of an all-gather's or
 *   a reduce-scatter's. */
#include <meshtrain/meshtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct result {
    size_t region, fwd_peak, step_peak;
    mt_comm_counters traffic;
} result;

#define TRY(call)                                                                                  \
    do {                                                                                           \
        if ((call) != MT_OK) {                                                                     \
            fprintf(stderr, "%s failed: %s\n", #call, mt_last_error());                            \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* The split activations' bytes when each rank holds rows of them (f32). */
static size_t region_bytes(const mt_gpt_config *c, size_t rows) {
    size_t C = (size_t)c->d_model, per_block = 4 * rows * C + 4 * rows;
    return sizeof(float) * ((size_t)c->layers * per_block + 2 * rows * C + 2 * rows);
}

static int measure(mt_mesh *mesh, mt_gpt_config cfg, int batch, const int *tokens, result *r) {
    mt_device *dev = mt_runtime_device(mt_mesh_runtime(mesh));
    mt_group *tp = NULL;
    TRY(mt_mesh_group(mesh, "tp", &tp));
    mt_gpt *gpt = NULL;
    TRY(mt_gpt_create(mesh, &cfg, &gpt));
    mt_fsdp_options o = mt_fsdp_defaults(mesh, "dp");
    for (int l = 0; l < cfg.layers; l++) TRY(mt_fsdp_shard(mt_gpt_block(gpt, l), &o));
    TRY(mt_fsdp_shard(mt_gpt_root(gpt), &o));
    float loss = 0.0f;
    mt_mem_stats ms;
    TRY(mt_gpt_forward_backward(gpt, tokens, batch, 1.0f, &loss)); /* warm-up */
    TRY(mt_zero_grad(mt_gpt_root(gpt)));
    mt_device_reset_peaks(dev);
    TRY(mt_gpt_forward(gpt, tokens, batch, &loss));
    mt_device_mem_stats(dev, &ms);
    r->fwd_peak = ms.peak[MT_MEM_ACTIVATIONS];
    mt_device_reset_peaks(dev);
    mt_group_counters_reset(tp);
    TRY(mt_gpt_forward_backward(gpt, tokens, batch, 1.0f, &loss));
    mt_group_counters(tp, &r->traffic);
    mt_device_mem_stats(dev, &ms);
    r->step_peak = ms.peak[MT_MEM_ACTIVATIONS];
    mt_gpt_destroy(gpt);
    return 0;
}

/* Bytes a ring collective sends per rank over the whole step. */
static double ring_bytes(const mt_comm_counters *c, int p) {
    double f = (double)(p - 1) / p;
    return f * (2.0 * (double)c->bytes[MT_COLL_ALL_REDUCE] +
                (double)c->bytes[MT_COLL_ALL_GATHER] + (double)c->bytes[MT_COLL_REDUCE_SCATTER]);
}

int main(int argc, char **argv) {
    mt_gpt_config cfg = {.layers = 4, .d_model = 256, .heads = 8, .seq = 128, .vocab = 256,
                         .seed = 1};
    int batch = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--layers")) cfg.layers = v;
        else if (!strcmp(argv[i], "--d-model")) cfg.d_model = v;
        else if (!strcmp(argv[i], "--heads")) cfg.heads = v;
        else if (!strcmp(argv[i], "--seq")) cfg.seq = v;
        else if (!strcmp(argv[i], "--batch")) batch = v;
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    mt_runtime *rt = NULL;
    TRY(mt_init(&rt, &argc, &argv));
    int p = mt_runtime_world_size(rt), rank = mt_runtime_rank(rt);
    mt_mesh *mesh = NULL;
    TRY(mt_mesh_create(rt, 2, (int[]){1, p}, (const char *[]){"dp", "tp"}, &mesh));
    size_t ntok = (size_t)batch * (size_t)(cfg.seq + 1);
    int *tokens = malloc(ntok * sizeof *tokens);
    if (!tokens) return 1;
    for (size_t i = 0; i < ntok; i++) tokens[i] = (int)((i * 2654435761u + 7u) % 256u);
    result res[2];
    int rc = 0;
    size_t n = (size_t)batch * (size_t)cfg.seq;
    for (int sp = 0; sp < 2; sp++) {
        cfg.sequence_parallel = sp;
        if (measure(mesh, cfg, batch, tokens, &res[sp])) return 1;
        res[sp].region = region_bytes(&cfg, sp ? n / (size_t)p : n);
    }
    if (rank == 0) {
        printf("GPT layers %d, d_model %d, heads %d, seq %d, batch %d on tp %d (%s)\n",
               cfg.layers, cfg.d_model, cfg.heads, cfg.seq, batch, p,
               mt_device_get_kind(mt_runtime_device(rt)) == MT_DEVICE_CUDA ? "cuda" : "cpu");
        printf("%-22s %14s %14s %8s\n", "per rank", "replicated", "seq-parallel", "ratio");
        const char *names[3] = {"split activations (B)", "forward peak (B)", "step peak (B)"};
        for (int k = 0; k < 3; k++) {
            size_t a = k == 0 ? res[0].region : k == 1 ? res[0].fwd_peak : res[0].step_peak;
            size_t b = k == 0 ? res[1].region : k == 1 ? res[1].fwd_peak : res[1].step_peak;
            printf("%-22s %14zu %14zu %8.3f\n", names[k], a, b, a ? (double)b / (double)a : 0.0);
        }
        printf("tp collectives in one forward-backward (calls, payload bytes):\n");
        for (int k = 0; k < MT_COLL_KINDS; k++)
            printf("%-22s %4llu %9llu B %4llu %9llu B\n", mt_coll_kind_name((mt_coll_kind)k),
                   (unsigned long long)res[0].traffic.calls[k],
                   (unsigned long long)res[0].traffic.bytes[k],
                   (unsigned long long)res[1].traffic.calls[k],
                   (unsigned long long)res[1].traffic.bytes[k]);
        double r0 = ring_bytes(&res[0].traffic, p), r1 = ring_bytes(&res[1].traffic, p);
        /* What sequence parallelism adds: the column-parallel inputs gathered again in backward
         * (2 per block and the head's, n x C each), the LayerNorm gradients' all-reduce. */
        double f = (double)(p - 1) / p, C = cfg.d_model;
        double regather = f * (2.0 * cfg.layers + 1) * (double)n * C * 4;
        double ln = 2.0 * f * (4.0 * cfg.layers + 2) * C * 4;
        printf("ring bytes sent per rank per step: %.0f replicated, %.0f sequence-parallel "
               "(difference %.0f = re-gathers %.0f + LayerNorm gradients %.0f)\n", r0, r1,
               r1 - r0, regather, ln);
        /* The measurement against the model of it: a mismatch means a collective nobody
         * accounted for (or a split that does not hold). */
        double off = r1 - r0 - (regather + ln); /* (p-1)/p is inexact for some p */
        if (off * off > 1e-18 * r1 * r1 || res[1].region * (size_t)p != res[0].region) {
            fprintf(stderr, "measured traffic or split activations differ from the model\n");
            rc = 1;
        }
    }
    free(tokens);
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    return rc;
}
