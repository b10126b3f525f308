/* Gradient clipping's sums of squares taken by the reduce-scatter (comm/coll_squares.h, the
 * shard views' grad_sq), under mtrun on a small GPT sharded over dp (x tp):
 *
 *   prog_fused_squares [--tp N] --expect fused|unfused
 *
 * After a synchronising backward into zeroed shards, every shard view with sums (all of them
 * with --expect fused, none with unfused) must hold, chunk by chunk, the bits of the CPU's sum of
 * squares kernel over the shard it stands for; the norm clipping computes from them must have
 * the bits of the norm it computes once they are dropped (a factor of 1 through
 * mt_fsdp_scale_grads, which clears them) and the shards read. A second backward that adds onto
 * the shards, a clip that scales them and mt_zero_grad each drop the sums; the next
 * backward into zeros takes them again. The environment picks the collective's path
 * (MT_COMM_LOCAL_DIRECT_RS, MT_COMM_CHUNK_BYTES, MT_COMM_SMALL_BYTES, MT_FSDP_FUSED_SQUARES:
 * tests/fsdp/fsdp.cmake). */
#include "check.h"
#include "core/cpu/sum_squares.h"
#include "fsdp/fsdp_internal.h"
#include "fsdp/fsdp_shards.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS 2
#define BATCH 2

typedef struct views_seen {
    size_t units, with_sums, bad_chunks;
} views_seen;

/* Which views have sums, and whether each chunk's sum has the kernel's bits over the shard. */
static views_seen look(mt_module *root) {
    views_seen s = {0};
    mt_fsdp_shard_view *v = NULL;
    size_t n = 0;
    CHECK_OK(mt_fsdp_collect_shards(root, &v, &n));
    mt_sum_squares_chunk_fn chunk_sum = mt_sum_squares_chunk_pick();
    for (size_t u = 0; u < n; u++) {
        s.units++;
        if (!v[u].grad_sq) continue;
        s.with_sums++;
        for (size_t c = 0; c * MT_SQ_CHUNK < v[u].n; c++) {
            size_t len = v[u].n - c * MT_SQ_CHUNK < MT_SQ_CHUNK ? v[u].n - c * MT_SQ_CHUNK
                                                                 : MT_SQ_CHUNK;
            double want = chunk_sum(v[u].grad + c * MT_SQ_CHUNK, len);
            if (memcmp(&want, &v[u].grad_sq[c], sizeof want) != 0 && s.bad_chunks++ < 5)
                fprintf(stderr, "unit %s chunk %zu: sum %.17g, the shard's %.17g\n",
                        v[u].unit_name, c, v[u].grad_sq[c], want);
        }
    }
    free(v);
    return s;
}

static long fused_count(mt_gpt *g) {
    long total = 0;
    mt_fsdp_debug d;
    for (int l = 0; l <= LAYERS; l++) {
        mt_module *m = l < LAYERS ? mt_gpt_block(g, l) : mt_gpt_root(g);
        if (mt_fsdp_debug_get(m, &d) == MT_OK) total += d.fused_squares;
    }
    return total;
}

/* The norm from the sums (if any), then from the shards once the sums are dropped: same bits. */
static float norms_agree(mt_module *root, const char *when) {
    float fused = NAN, read = NAN;
    CHECK_OK(mt_clip_grad_norm(root, 0.0f, &fused));
    CHECK_OK(mt_fsdp_scale_grads(root, 1.0f));
    CHECK_MSG(look(root).with_sums == 0, "%s: sums kept after a scaling", when);
    CHECK_OK(mt_clip_grad_norm(root, 0.0f, &read));
    CHECK_MSG(memcmp(&fused, &read, sizeof fused) == 0 && isfinite(read) && read > 0.0f,
              "%s: norm %a from the sums, %a from the shards", when, (double)fused,
              (double)read);
    return read;
}

int main(int argc, char **argv) {
    int tp = 1;
    const char *expect = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--tp") == 0) tp = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--expect") == 0) expect = argv[i + 1];
    }
    if (tp < 1 || !expect || (strcmp(expect, "fused") && strcmp(expect, "unfused"))) {
        fprintf(stderr, "usage: prog_fused_squares [--tp N] --expect fused|unfused\n");
        return 2;
    }
    bool fused = strcmp(expect, "fused") == 0;
    mt_runtime *rt = NULL;
    CHECK_OK(mt_init(&rt, NULL, NULL));
    if (!rt) return check_report("prog_fused_squares");
    int world = mt_runtime_world_size(rt), rank = mt_runtime_rank(rt);
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 2, (int[]){world / tp, tp}, (const char *[]){"dp", "tp"},
                            &mesh));
    /* Blocks of about 200k parameters: shards of several chunks of the sums at 2 to 4 ranks,
     * the last one partial. */
    mt_gpt_config cfg = {.layers = LAYERS, .d_model = 128, .heads = 4, .seq = 16, .vocab = 256,
                         .seed = 7};
    mt_gpt *g = NULL;
    if (mesh) CHECK_OK(mt_gpt_create(mesh, &cfg, &g));
    if (!g) return check_report("prog_fused_squares");
    mt_fsdp_options fo = mt_fsdp_defaults(mesh, "dp");
    for (int l = 0; l < LAYERS; l++) CHECK_OK(mt_fsdp_shard(mt_gpt_block(g, l), &fo));
    mt_module *root = mt_gpt_root(g);
    CHECK_OK(mt_fsdp_shard(root, &fo));
    int tokens[BATCH * 17];
    int dp_rank = rank / tp; /* tp ranks of one dp rank see the same batch */
    for (int i = 0; i < BATCH * 17; i++) tokens[i] = (i * 31 + dp_rank * 101 + 5) % cfg.vocab;
    float loss;

    /* A backward into zeroed shards. */
    CHECK_OK(mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss));
    views_seen s = look(root);
    CHECK_MSG(s.bad_chunks == 0, "%zu chunks' sums differ from the shard's", s.bad_chunks);
    CHECK_MSG(s.with_sums == (fused ? s.units : 0), "rank %d: %zu of %zu units with sums, "
              "expected them %s", rank, s.with_sums, s.units, expect);
    CHECK_MSG((fused_count(g) > 0) == fused, "rank %d: %ld landings with sums, expected %s",
              rank, fused_count(g), expect);
    float norm = norms_agree(root, "first backward");

    /* Adding onto the shards: the reduce-scatter lands in a buffer, the sums would be of it. */
    CHECK_OK(mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss));
    CHECK_MSG(look(root).with_sums == 0, "sums kept after an accumulating backward");
    float twice = norms_agree(root, "accumulated");
    CHECK_MSG(fabsf(twice - 2.0f * norm) <= 1e-4f * twice, "norm %g after two backwards of the "
              "same batch, %g after one", (double)twice, (double)norm);

    /* Zeroed again: the sums come back; a clip that scales drops them. */
    CHECK_OK(mt_zero_grad(root));
    CHECK_MSG(look(root).with_sums == 0, "sums kept after mt_zero_grad");
    CHECK_OK(mt_gpt_forward_backward(g, tokens, BATCH, 1.0f, &loss));
    s = look(root);
    CHECK_MSG(s.bad_chunks == 0 && s.with_sums == (fused ? s.units : 0),
              "after zero_grad: %zu of %zu units with sums, %zu chunks wrong", s.with_sums,
              s.units, s.bad_chunks);
    float before = NAN, after = NAN;
    CHECK_OK(mt_clip_grad_norm(root, norm / 2.0f, &before));
    CHECK_MSG(memcmp(&before, &norm, sizeof norm) == 0, "the same gradients' norm: %a then %a",
              (double)norm, (double)before);
    CHECK_MSG(look(root).with_sums == 0, "sums kept after clipping scaled the gradients");
    CHECK_OK(mt_clip_grad_norm(root, 0.0f, &after));
    CHECK_MSG(fabsf(after - norm / 2.0f) <= 1e-5f * norm, "norm %g after clipping to %g",
              (double)after, (double)(norm / 2.0f));
    if (rank == 0)
        printf("world %d tp %d: norm %.9g, sums %s, %ld landings with sums\n", world, tp,
               (double)norm, expect, fused_count(g));
    mt_gpt_destroy(g);
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    return check_report("prog_fused_squares");
}
