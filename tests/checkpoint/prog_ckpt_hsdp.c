/* HSDP checkpoints, through mtrun on 4 ranks: a GPT sharded over "shard" and replicated over
 * "rep" ({"rep": 2, "shard": 2}) saves; only replicate rank 0's ranks write (two data files);
 * the checkpoint loads into plain FSDP over 4 ranks and back into HSDP, and every load gives
 * the saved model: the same forward loss, bit for bit, on the same tokens.
 *
 *   mtrun --standalone --nproc_per_node 4 prog_ckpt_hsdp DIR */
#include <meshtrain/meshtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        mt_status st_ = (call);                                                                    \
        if (st_ != MT_OK) {                                                                        \
            fprintf(stderr, "FAIL: %s: %s\n", #call, mt_last_error());                             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { LAYERS = 2, BATCH = 2, SEQ = 16 };

typedef struct model {
    mt_mesh *mesh;
    mt_gpt *gpt;
    mt_adamw *opt;
} model;

/* hsdp: {"rep": 2, "shard": 2} with replicate_dim "rep"; else {"dp": 4}. */
static void build(mt_runtime *rt, bool hsdp, uint64_t seed, model *m) {
    if (hsdp)
        CHECK(mt_mesh_create(rt, 2, (int[]){2, 2}, (const char *[]){"rep", "shard"}, &m->mesh));
    else
        CHECK(mt_mesh_create(rt, 1, (int[]){4}, (const char *[]){"dp"}, &m->mesh));
    mt_gpt_config cfg = {.layers = LAYERS, .d_model = 32, .heads = 4, .seq = SEQ, .vocab = 256,
                         .seed = seed};
    CHECK(mt_gpt_create(m->mesh, &cfg, &m->gpt));
    mt_fsdp_options fo = mt_fsdp_defaults(m->mesh, hsdp ? "shard" : "dp");
    if (hsdp) fo.replicate_dim = "rep";
    for (int l = 0; l < LAYERS; l++) CHECK(mt_fsdp_shard(mt_gpt_block(m->gpt, l), &fo));
    CHECK(mt_fsdp_shard(mt_gpt_root(m->gpt), &fo));
    mt_adamw_options ao = {.lr = 1e-2f};
    CHECK(mt_adamw_create(mt_gpt_root(m->gpt), &ao, &m->opt));
}

static void destroy(model *m) {
    mt_adamw_destroy(m->opt);
    mt_gpt_destroy(m->gpt);
    mt_mesh_destroy(m->mesh);
}

static void tokens(int *t, int salt) {
    for (int i = 0; i < BATCH * (SEQ + 1); i++) t[i] = (i * 7 + salt * 13) % 256;
}

static float eval_loss(model *m) {
    int t[BATCH * (SEQ + 1)];
    tokens(t, 99);
    float loss;
    CHECK(mt_gpt_forward(m->gpt, t, BATCH, &loss));
    return loss;
}

int main(int argc, char **argv) {
    mt_runtime *rt;
    CHECK(mt_init(&rt, &argc, &argv));
    if (argc != 2 || mt_runtime_world_size(rt) != 4) {
        fprintf(stderr, "usage: mtrun --nproc_per_node 4 prog_ckpt_hsdp DIR\n");
        return 2;
    }
    const char *dir = argv[1];
    int rank = mt_runtime_rank(rt), failures = 0;

    model a = {0};
    build(rt, true, 5, &a);
    for (int step = 0; step < 2; step++) { /* AdamW state that is not zero */
        int t[BATCH * (SEQ + 1)];
        tokens(t, step + rank);
        float loss;
        CHECK(mt_gpt_forward_backward(a.gpt, t, BATCH, 1.0f, &loss));
        CHECK(mt_adamw_step(a.opt));
        CHECK(mt_zero_grad(mt_gpt_root(a.gpt)));
    }
    float saved = eval_loss(&a);
    mt_checkpoint_options o = mt_checkpoint_defaults();
    o.sync = true;
    CHECK(mt_checkpoint_save(mt_gpt_root(a.gpt), a.opt, dir, &o));
    destroy(&a);

    if (rank == 0) { /* replicate rank 1's ranks (2 and 3) hold copies: they write nothing */
        char path[4096];
        for (int r = 0; r < 4; r++) {
            snprintf(path, sizeof path, "%s/step-00000002/rank-%05d.bin", dir, r);
            FILE *f = fopen(path, "rb");
            bool want = r < 2;
            if ((f != NULL) != want) {
                fprintf(stderr, "FAIL: %s %s\n", path, want ? "missing" : "written by a replica");
                failures++;
            }
            if (f) fclose(f);
        }
    }

    const bool layouts[2] = {false, true}; /* FSDP over 4, then HSDP again */
    for (int i = 0; i < 2; i++) {
        model b = {0};
        build(rt, layouts[i], 77, &b); /* another seed: only the load makes it equal */
        float before = eval_loss(&b);
        mt_checkpoint_info info;
        CHECK(mt_checkpoint_load(mt_gpt_root(b.gpt), b.opt, dir, NULL, 0, &info));
        float after = eval_loss(&b);
        if (memcmp(&after, &saved, sizeof after) != 0 || info.step != 2 ||
            mt_adamw_steps(b.opt) != 2) {
            fprintf(stderr, "FAIL: rank %d: %s: loss %.9g after the load (saved %.9g, before "
                    "%.9g), step %ld, optimizer steps %ld\n", rank,
                    layouts[i] ? "HSDP" : "FSDP over 4", (double)after, (double)saved,
                    (double)before, info.step, mt_adamw_steps(b.opt));
            failures++;
        } else if (rank == 0) {
            printf("ok: HSDP checkpoint loaded into %s: loss %.9g as saved\n",
                   layouts[i] ? "HSDP" : "FSDP over 4", (double)after);
        }
        destroy(&b);
    }
    mt_finalize(rt);
    return failures ? 1 : 0;
}
