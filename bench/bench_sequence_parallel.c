/* Sequence parallelism's cost and saving on the GPT (run through mtrun; every rank one tp rank):
 *
 *   mtrun --standalone --nproc_per_node T mt-bench-sequence-parallel [--layers L] [--d-model C]
 *         [--heads H] [--seq S] [--batch B]
 *
 * For the model without config.sequence_parallel and with each of its modes (MT_GPT_SP_REGATHER,
 * MT_GPT_SP_KEEP_GATHERED), rank 0 reports:
 *   the bytes of the activations sequence parallelism splits, computed from the shapes the
 *   model allocates (per block ln_1, ln_2 with their means and rstds, the two residual sums; the
 *   embedding output; ln_f with its mean and rstd): 1 / tp of them when re-gathering (keeping
 *   the column-parallel inputs gathered holds ln_1, ln_2 and ln_f's outputs whole). This row is
 *   arithmetic; what is measured is the activations the forward leaves for the backward
 *   (MT_MEM_ACTIVATIONS when the root's forward ends, less what was there before it: the tp
 *   context's kept scratch): their saving against the replicated run
 *   must be the split set's, to the byte, in both modes;
 *   the device's activation peak (MT_MEM_ACTIVATIONS) of a forward and of a forward-backward,
 *   measured;
 *   the tp group's collectives in one forward-backward (mt_group_counters), and the bytes a ring
 *   sends per rank from them: 2 (p-1)/p of an all-reduce's payload, (p-1)/p of an all-gather's or
 *   a reduce-scatter's, whose difference from the replicated run must be the model's: the
 *   re-gathers (re-gather only) and the LayerNorm gradients' all-reduce. */
#include <meshtrain/meshtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct result {
    size_t region, held, fwd_peak, step_peak;
    mt_comm_counters traffic;
} result;

#define TRY(call)                                                                                  \
    do {                                                                                           \
        if ((call) != MT_OK) {                                                                     \
            fprintf(stderr, "%s failed: %s\n", #call, mt_last_error());                            \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* The split activations' bytes when each rank holds rows of them and ln_rows of the LayerNorm
 * outputs (rows, or all n when kept gathered) (f32). */
static size_t region_bytes(const mt_gpt_config *c, size_t rows, size_t ln_rows) {
    size_t C = (size_t)c->d_model, per_block = 2 * ln_rows * C + 2 * rows * C + 4 * rows;
    return sizeof(float) * ((size_t)c->layers * per_block + rows * C + ln_rows * C + 2 * rows);
}

/* The activations the forward leaves for the backward, read when the root's forward ends (its
 * transients freed, nothing of the backward allocated yet). */
typedef struct held_probe {
    mt_device *dev;
    size_t bytes;
} held_probe;

static mt_status probe_held(mt_module *module, void *user, mt_status status) {
    (void)module;
    held_probe *h = user;
    mt_mem_stats ms;
    mt_device_mem_stats(h->dev, &ms);
    h->bytes = ms.current[MT_MEM_ACTIVATIONS];
    return status;
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
    static const mt_module_hooks probe = {.post_forward = probe_held};
    held_probe h = {.dev = dev};
    TRY(mt_module_add_hooks(mt_gpt_root(gpt), &h, &probe, &h));
    float loss = 0.0f;
    mt_mem_stats ms;
    TRY(mt_gpt_forward_backward(gpt, tokens, batch, 1.0f, &loss)); /* warm-up */
    TRY(mt_zero_grad(mt_gpt_root(gpt)));
    /* What exists before the forward (the tp context's kept sequence-parallel scratch, since
     * the warm-up) is not what the forward leaves for the backward. */
    mt_device_mem_stats(dev, &ms);
    size_t before = ms.current[MT_MEM_ACTIVATIONS];
    mt_device_reset_peaks(dev);
    TRY(mt_gpt_forward(gpt, tokens, batch, &loss));
    mt_device_mem_stats(dev, &ms);
    r->fwd_peak = ms.peak[MT_MEM_ACTIVATIONS];
    r->held = h.bytes - before;
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
    enum { MODES = 3 }; /* off, re-gather, keep gathered */
    static const char *const mode_names[MODES] = {"replicated", "SP re-gather", "SP keep-gath."};
    result res[MODES];
    int rc = 0;
    size_t n = (size_t)batch * (size_t)cfg.seq, rows = n / (size_t)p;
    for (int sp = 0; sp < MODES; sp++) {
        cfg.sequence_parallel = sp; /* MT_GPT_SP_OFF, _REGATHER, _KEEP_GATHERED */
        if (measure(mesh, cfg, batch, tokens, &res[sp])) return 1;
        res[sp].region = sp == 0   ? region_bytes(&cfg, n, n)
                         : sp == 1 ? region_bytes(&cfg, rows, rows)
                                   : region_bytes(&cfg, rows, n);
    }
    if (rank == 0) {
        printf("GPT layers %d, d_model %d, heads %d, seq %d, batch %d on tp %d (%s)\n",
               cfg.layers, cfg.d_model, cfg.heads, cfg.seq, batch, p,
               mt_device_get_kind(mt_runtime_device(rt)) == MT_DEVICE_CUDA ? "cuda" : "cpu");
        printf("%-22s", "per rank (ratio)");
        for (int m = 0; m < MODES; m++) printf(" %22s", mode_names[m]);
        printf("\n");
        /* The first row is computed from the shapes, not measured: it only says what the
         * split covers; the peaks below are the device's accounting. */
        const char *names[4] = {"split acts, shapes (B)", "held after fwd (B)", "forward peak (B)",
                                "step peak (B)"};
        for (int k = 0; k < 4; k++) {
            printf("%-22s", names[k]);
            for (int m = 0; m < MODES; m++) {
                const size_t vals[4] = {res[m].region, res[m].held, res[m].fwd_peak,
                                        res[m].step_peak};
                const size_t vals0[4] = {res[0].region, res[0].held, res[0].fwd_peak,
                                         res[0].step_peak};
                size_t v = vals[k], v0 = vals0[k];
                printf(" %14zu (%5.3f)", v, v0 ? (double)v / (double)v0 : 0.0);
            }
            printf("\n");
        }
        printf("tp collectives in one forward-backward (calls, payload bytes):\n");
        for (int k = 0; k < MT_COLL_KINDS; k++) {
            printf("%-22s", mt_coll_kind_name((mt_coll_kind)k));
            for (int m = 0; m < MODES; m++)
                printf(" %4llu %15llu B", (unsigned long long)res[m].traffic.calls[k],
                       (unsigned long long)res[m].traffic.bytes[k]);
            printf("\n");
        }
        /* What sequence parallelism adds: the column-parallel inputs gathered again in backward
         * (2 per block and the head's, n x C each; re-gather only), the LayerNorm gradients'
         * all-reduce (both modes). */
        double f = (double)(p - 1) / p, C = cfg.d_model;
        double regather = f * (2.0 * cfg.layers + 1) * (double)n * C * 4;
        double ln = 2.0 * f * (4.0 * cfg.layers + 2) * C * 4;
        double r0 = ring_bytes(&res[0].traffic, p);
        for (int m = 1; m < MODES; m++) {
            double r = ring_bytes(&res[m].traffic, p), extra = (m == 1 ? regather : 0.0) + ln;
            printf("ring bytes sent per rank per step, %s: %.0f against %.0f replicated "
                   "(difference %.0f = re-gathers %.0f + LayerNorm gradients %.0f)\n",
                   mode_names[m], r, r0, r - r0, m == 1 ? regather : 0.0, ln);
            /* The measurement against the model of it: a mismatch means a collective nobody
             * accounted for. */
            double off = r - r0 - extra; /* (p-1)/p is inexact for some p */
            if (off * off > 1e-18 * r * r) {
                fprintf(stderr, "%s: measured traffic differs from the model\n", mode_names[m]);
                rc = 1;
            }
            /* The saving measured on the device (activations held for the backward) against
             * the split set's shapes: exact, or the split covers other buffers than it says. */
            size_t saved = res[0].held - res[m].held, want = res[0].region - res[m].region;
            printf("activations held after the forward, %s: %zu bytes fewer than replicated "
                   "(the split set's shapes say %zu)\n", mode_names[m], saved, want);
            if (res[m].held > res[0].held || saved != want) {
                fprintf(stderr, "%s: the measured activation saving %zu differs from the split "
                        "set's %zu\n", mode_names[m], saved, want);
                rc = 1;
            }
        }
    }
    free(tokens);
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    return rc;
}
