/* The FSDP benchmarks' model (bench/bench_fsdp_mlp.h). */
#include "bench/bench_fsdp_mlp.h"

#include "core/error.h"

#include <stdlib.h>
#include <string.h>

mt_status mt_bench_mlp_create(mt_runtime *rt, const char *prog, int layers, int width, int batch,
                              mt_bench_mlp *b) {
    memset(b, 0, sizeof *b);
    int world = mt_runtime_world_size(rt);
    MT_TRY(mt_mesh_create(rt, 1, (int[]){world}, (const char *[]){"dp"}, &b->mesh));
    b->cfg = (mt_mlp_config){.layers = layers, .in_dim = width, .width = width,
                             .out_dim = width, .seed = 1};
    size_t bw = (size_t)batch * (size_t)width;
    b->x = malloc(bw * sizeof *b->x);
    b->y = malloc(bw * sizeof *b->y);
    if (!b->x || !b->y)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "%s: out of host memory for a batch of %d x %d",
                        prog, batch, width);
    MT_TRY(mt_mlp_create(b->mesh, &b->cfg, &b->mlp));
    mt_fsdp_options fo = mt_fsdp_defaults(b->mesh, "dp");
    for (int l = 0; l < layers; l++) MT_TRY(mt_fsdp_shard(mt_mlp_layer(b->mlp, l), &fo));
    return mt_fsdp_shard(mt_mlp_root(b->mlp), &fo);
}

void mt_bench_mlp_destroy(mt_bench_mlp *b) {
    mt_mlp_destroy(b->mlp);
    mt_mesh_destroy(b->mesh);
    free(b->x);
    free(b->y);
    memset(b, 0, sizeof *b);
}
