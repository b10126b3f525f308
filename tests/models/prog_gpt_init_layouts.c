/* GPT initial values are the same bits for every dp x tp, and loading a checkpoint into a deferred,
 * sharded, never initialised GPT gives it that checkpoint's values (tests/models/
 * gpt_init_layouts.sh runs it through mtrun):
 *
 *   prog_gpt_init_layouts save DIR         1 rank: a GPT created with its values (defer_init
 *                                          false: each whole tensor initialised at once),
 *                                          saved model-only into DIR
 *   prog_gpt_init_layouts check DIR [tp2]  dp = world (or dp world/2 x tp 2): a deferred GPT
 *                                          initialised shard by shard, and a deferred GPT into
 *                                          which DIR is loaded instead (it then needs no
 *                                          initialiser): every gathered parameter is bitwise
 *                                          equal between the two, and so is a forward's loss */
#include "check.h"
#include "fsdp/fsdp_internal.h"

#include <meshtrain/meshtrain.h>

#include <stdlib.h>
#include <string.h>

enum { LAYERS = 2, BATCH = 2, SEQ = 8 };

/* vocab 257: with tp 2 the embedding gets a padding row, which the checkpoint does not hold. */
static const mt_gpt_config CFG = {.layers = LAYERS, .d_model = 32, .heads = 4, .seq = SEQ,
                                  .vocab = 257, .seed = 42};

static mt_gpt *build(mt_mesh *mesh, bool defer) {
    mt_gpt_config cfg = CFG;
    cfg.defer_init = defer;
    mt_gpt *gpt = NULL;
    CHECK_OK(mt_gpt_create(mesh, &cfg, &gpt));
    if (!gpt) return NULL;
    mt_fsdp_options fo = mt_fsdp_defaults(mesh, "dp");
    for (int l = 0; l < LAYERS; l++) CHECK_OK(mt_fsdp_shard(mt_gpt_block(gpt, l), &fo));
    CHECK_OK(mt_fsdp_shard(mt_gpt_root(gpt), &fo));
    return gpt;
}

static float *read_host(mt_device *dev, mt_param *p) {
    size_t n = mt_param_numel(p);
    float *buf = NULL, *host = malloc(n * sizeof *host);
    CHECK_OK(mt_device_alloc(dev, n * sizeof(float), MT_MEM_OTHER, (void **)&buf));
    CHECK_OK(mt_param_read_f32(p, buf));
    CHECK_OK(mt_device_copy(dev, host, buf, n * sizeof(float), MT_COPY_DEVICE_TO_HOST, NULL));
    mt_device_free(dev, buf);
    return host;
}

/* Every parameter of module a (gathered) against the same one of b. */
static void compare_unit(mt_device *dev, mt_module *a, mt_module *b) {
    mt_fsdp_unit *ua = mt_fsdp_unit_of(a), *ub = mt_fsdp_unit_of(b);
    CHECK_OK(mt_fsdp_unshard_wait(ua));
    CHECK_OK(mt_fsdp_unshard_wait(ub));
    for (size_t i = 0; i < mt_module_param_count(a); i++) {
        mt_param *pa = mt_module_param(a, i), *pb = mt_module_param(b, i);
        size_t n = mt_param_numel(pa);
        float *va = read_host(dev, pa), *vb = read_host(dev, pb);
        CHECK_MSG(memcmp(va, vb, n * sizeof *va) == 0, "%s.%s: initialised and loaded values "
                  "differ", mt_module_name(a), mt_param_name(pa));
        free(va);
        free(vb);
    }
    CHECK_OK(mt_fsdp_reshard(ua));
    CHECK_OK(mt_fsdp_reshard(ub));
}

static float loss_of(mt_gpt *gpt) {
    int t[BATCH * (SEQ + 1)];
    for (int i = 0; i < BATCH * (SEQ + 1); i++) t[i] = (i * 37 + 5) % 257;
    float loss = 0;
    CHECK_OK(mt_gpt_forward(gpt, t, BATCH, &loss));
    return loss;
}

static void check(mt_mesh *mesh, mt_device *dev, const char *dir) {
    mt_gpt *init = build(mesh, true), *loaded = build(mesh, true);
    if (!init || !loaded) return;
    CHECK_OK(mt_module_init_params(mt_gpt_root(init)));
    mt_module *root = mt_gpt_root(loaded);
    CHECK(mt_param_needs_init(mt_module_param(root, 0)));
    CHECK_OK(mt_checkpoint_load(root, NULL, dir, NULL, 0, NULL));
    /* Loaded: nothing left to initialise, and an initialiser is refused. */
    for (int u = 0; u <= LAYERS; u++) {
        mt_module *m = u < LAYERS ? mt_gpt_block(loaded, u) : root;
        for (size_t i = 0; i < mt_module_param_count(m); i++)
            CHECK(!mt_param_needs_init(mt_module_param(m, i)));
    }
    CHECK_OK(mt_module_init_params(root));
    mt_initialiser zeros = mt_init_zeros();
    CHECK(mt_param_init(mt_module_param(root, 0), &zeros) == MT_ERR_INVALID_ARG);
    for (int l = 0; l < LAYERS; l++) compare_unit(dev, mt_gpt_block(init, l), mt_gpt_block(loaded, l));
    compare_unit(dev, mt_gpt_root(init), root);
    float a = loss_of(init), b = loss_of(loaded);
    CHECK_MSG(memcmp(&a, &b, sizeof a) == 0, "forward loss %.9g initialised, %.9g loaded",
              (double)a, (double)b);
    printf("forward loss %.9g (initialised shard by shard), %.9g (loaded)\n", (double)a,
           (double)b);
    mt_gpt_destroy(init);
    mt_gpt_destroy(loaded);
}

int main(int argc, char **argv) {
    mt_runtime *rt;
    if (mt_init(&rt, &argc, &argv) != MT_OK) {
        fprintf(stderr, "mt_init: %s\n", mt_last_error());
        return 1;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: prog_gpt_init_layouts save|check DIR [tp2]\n");
        return 2;
    }
    int world = mt_runtime_world_size(rt);
    bool tp2 = argc > 3 && strcmp(argv[3], "tp2") == 0;
    mt_mesh *mesh = NULL;
    CHECK_OK(mt_mesh_create(rt, 2, (int[]){tp2 ? world / 2 : world, tp2 ? 2 : 1},
                            (const char *[]){"dp", "tp"}, &mesh));
    mt_device *dev = mt_runtime_device(rt);
    if (strcmp(argv[1], "save") == 0) {
        mt_gpt *gpt = build(mesh, false); /* each whole tensor initialised at once */
        mt_checkpoint_options o = mt_checkpoint_defaults();
        o.sync = true;
        if (gpt) CHECK_OK(mt_checkpoint_save(mt_gpt_root(gpt), NULL, argv[2], &o));
        mt_gpt_destroy(gpt);
    } else {
        check(mesh, dev, argv[2]);
    }
    mt_mesh_destroy(mesh);
    char name[96];
    snprintf(name, sizeof name, "prog_gpt_init_layouts %s%s rank %d", argv[1], tp2 ? " tp2" : "",
             mt_runtime_rank(rt));
    int rc = check_report(name);
    mt_finalize(rt);
    return rc;
}
