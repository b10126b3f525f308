/* mt-ckpt export / import: meshtrain's GPT (models/gpt.c) <-> Hugging Face GPT-2 in safetensors.
 *
 * meshtrain stores linear weights as [out, in] and q, k, v stacked as [3, C(out), C(in)]; GPT-2's
 * Conv1D stores [in, out] with q, k, v side by side along out ([C, 3C]). The LM head is tied to
 * the token embedding in both, and the checkpoint's wte has exactly vocab rows (tp padding is not
 * saved). GELU is the tanh approximation ("gelu_new") and LayerNorm's epsilon 1e-5 in both. */
#include "tools/mt-ckpt/mt_ckpt.h"
#include "tools/mt-ckpt/safetensors.h"

#include "checkpoint/ckpt_commit.h"
#include "checkpoint/ckpt_fs.h"

#include <meshtrain/memory.h>
#include <meshtrain/status.h>

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_EXTRA "model_config"
/* The text train_gpt saves and reads (examples/train_gpt.c): written exactly so. */
#define CONFIG_FORMAT                                                                              \
    "{\"model\": \"gpt2\", \"layers\": %d, \"d_model\": %d, \"heads\": %d, \"seq\": %d, "        \
    "\"vocab\": %d}"

typedef struct gpt_config {
    int layers, d_model, heads, seq, vocab;
} gpt_config;

/* How a tensor changes between the layouts. */
typedef enum transform {
    SAME,      /* identical element order (a [3, C] bias is a [3C] one) */
    TRANSPOSE, /* meshtrain [out, in] <-> GPT-2 [in, out] */
    QKV        /* meshtrain [3, C, C] (j, out, in) <-> GPT-2 [C, 3C] (in, j * C + out) */
} transform;

typedef struct tensor_map {
    const char *ours;   /* below "model/", with %d for the block */
    const char *theirs; /* below "transformer.", with %d for the block */
    transform how;
    int tp_dim; /* our tp placement (recorded in imported checkpoints): -1 replicate */
} tensor_map;

static const tensor_map root_map[] = {
    {"wte.weight", "wte.weight", SAME, 0},
    {"wpe.weight", "wpe.weight", SAME, -1},
    {"ln_f.weight", "ln_f.weight", SAME, -1},
    {"ln_f.bias", "ln_f.bias", SAME, -1},
};

static const tensor_map block_map[] = {
    {"block%d.ln_1.weight", "h.%d.ln_1.weight", SAME, -1},
    {"block%d.ln_1.bias", "h.%d.ln_1.bias", SAME, -1},
    {"block%d.attn.qkv.weight", "h.%d.attn.c_attn.weight", QKV, 1},
    {"block%d.attn.qkv.bias", "h.%d.attn.c_attn.bias", SAME, 1},
    {"block%d.attn.proj.weight", "h.%d.attn.c_proj.weight", TRANSPOSE, 1},
    {"block%d.attn.proj.bias", "h.%d.attn.c_proj.bias", SAME, -1},
    {"block%d.ln_2.weight", "h.%d.ln_2.weight", SAME, -1},
    {"block%d.ln_2.bias", "h.%d.ln_2.bias", SAME, -1},
    {"block%d.mlp.fc.weight", "h.%d.mlp.c_fc.weight", TRANSPOSE, 0},
    {"block%d.mlp.fc.bias", "h.%d.mlp.c_fc.bias", SAME, 0},
    {"block%d.mlp.proj.weight", "h.%d.mlp.c_proj.weight", TRANSPOSE, 1},
    {"block%d.mlp.proj.bias", "h.%d.mlp.c_proj.bias", SAME, -1},
};
#define ROOT_N (sizeof root_map / sizeof *root_map)
#define BLOCK_N (sizeof block_map / sizeof *block_map)

/* Our global shape of a tensor of the map. */
static int our_shape(const gpt_config *c, const char *ours, int64_t *shape) {
    int64_t C = c->d_model;
    struct { const char *suffix; int ndim; int64_t s[3]; } table[] = {
        {"wte.weight", 2, {c->vocab, C}}, {"wpe.weight", 2, {c->seq, C}},
        {"qkv.weight", 3, {3, C, C}},     {"qkv.bias", 2, {3, C}},
        {"attn.proj.weight", 2, {C, C}},  {"fc.weight", 2, {4 * C, C}},
        {"fc.bias", 1, {4 * C}},          {"mlp.proj.weight", 2, {C, 4 * C}},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        size_t ls = strlen(table[i].suffix), lo = strlen(ours);
        if (lo >= ls && strcmp(ours + lo - ls, table[i].suffix) == 0) {
            memcpy(shape, table[i].s, sizeof table[i].s);
            return table[i].ndim;
        }
    }
    shape[0] = C; /* LayerNorms and the remaining biases */
    return 1;
}

/* GPT-2's shape: SAME keeps ours (a [3, C] bias becomes [3C]); the others are [in, out]. */
static int their_shape(const gpt_config *c, const tensor_map *m, const int64_t *ours, int nd,
                       int64_t *shape) {
    if (m->how == QKV) {
        shape[0] = c->d_model;
        shape[1] = 3 * (int64_t)c->d_model;
        return 2;
    }
    if (m->how == TRANSPOSE) {
        shape[0] = ours[1];
        shape[1] = ours[0];
        return 2;
    }
    if (nd == 2 && ours[0] == 3) { /* the qkv bias */
        shape[0] = 3 * ours[1];
        return 1;
    }
    memcpy(shape, ours, (size_t)nd * sizeof *shape);
    return nd;
}

/* dst = src in the other layout; to_theirs gives the direction. */
static void convert(transform how, const int64_t *ours, const float *src, float *dst,
                    bool to_theirs) {
    if (how == TRANSPOSE) { /* ours [R, K] <-> theirs [K, R] */
        int64_t R = ours[0], K = ours[1];
        for (int64_t r = 0; r < R; r++)
            for (int64_t k = 0; k < K; k++) {
                if (to_theirs) dst[k * R + r] = src[r * K + k];
                else dst[r * K + k] = src[k * R + r];
            }
        return;
    }
    if (how == QKV) { /* ours [3][C][C] (j, out, in) <-> theirs [C][3C] (in, j*C + out) */
        int64_t C = ours[1];
        for (int64_t j = 0; j < 3; j++)
            for (int64_t o = 0; o < C; o++)
                for (int64_t i = 0; i < C; i++) {
                    size_t a = (size_t)((j * C + o) * C + i), b = (size_t)(i * 3 * C + j * C + o);
                    if (to_theirs) dst[b] = src[a];
                    else dst[a] = src[b];
                }
    }
}

static uint64_t numel_of(const int64_t *shape, int nd) {
    uint64_t n = 1;
    for (int d = 0; d < nd; d++) n *= (uint64_t)shape[d];
    return n;
}

/* ---- export ---------------------------------------------------------------------------------- */

static int read_config(const mt_ckpt_meta *m, mt_ckpt_reader *r, gpt_config *c) {
    const mt_ckpt_extra_meta *e = mt_ckpt_meta_extra(m, CONFIG_EXTRA);
    if (!e) {
        fprintf(stderr, "mt-ckpt: '%s' has no '%s' extra: not a GPT checkpoint of train_gpt or "
                "mt-ckpt import\n", m->dir, CONFIG_EXTRA);
        return -1;
    }
    char *text = malloc(e->bytes + 1);
    if (!text || mt_ckpt_read_chunk(r, &e->chunks[0], "extra '" CONFIG_EXTRA "'", text) != MT_OK) {
        if (text) mt_ckpt_tool_error();
        free(text);
        return -1;
    }
    text[e->bytes] = '\0';
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    free(text);
    int rc = json_unpack(j, "{s:i,s:i,s:i,s:i,s:i}", "layers", &c->layers, "d_model",
                         &c->d_model, "heads", &c->heads, "seq", &c->seq, "vocab", &c->vocab);
    json_decref(j);
    if (rc != 0 || c->layers < 1 || c->d_model < 1 || c->heads < 1 || c->seq < 1 ||
        c->vocab < 1) {
        fprintf(stderr, "mt-ckpt: '%s': the model configuration is not a GPT-2 one\n", m->dir);
        return -1;
    }
    return 0;
}

/* No bos/eos: the vocabulary is the program's (transformers would assume GPT-2's 50256). */
static int write_config_json(const char *dir, const gpt_config *c) {
    json_t *j = json_pack(
        "{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:n,s:s,s:f,s:f,s:f,s:f,s:f,s:b,s:n,s:n,s:s}",
        "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "vocab_size", c->vocab,
        "n_positions", c->seq, "n_ctx", c->seq, "n_embd", c->d_model, "n_layer", c->layers,
        "n_head", c->heads, "n_inner", "activation_function", "gelu_new", "layer_norm_epsilon",
        1e-5, "resid_pdrop", 0.0, "embd_pdrop", 0.0, "attn_pdrop", 0.0, "initializer_range", 0.02,
        "tie_word_embeddings", 1, "bos_token_id", "eos_token_id", "torch_dtype", "float32");
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!text) {
        fprintf(stderr, "mt-ckpt: cannot format config.json\n");
        return -1;
    }
    mt_status st = mt_ckpt_replace_file(dir, "config.json", text, strlen(text));
    free(text);
    if (st != MT_OK) {
        mt_ckpt_tool_error();
        return -1;
    }
    return 0;
}

/* The export is written tensor by tensor (mt_st_write_filled): only the tensor being written is
 * in memory, converted to GPT-2's layout, so a model larger than memory exports. */
typedef struct export_state {
    const mt_ckpt_meta *meta;
    mt_ckpt_reader *reader;
    gpt_config cfg;
    mt_st_entry *entries;
    char **names;
    const tensor_map **maps;
    int *blocks;
    size_t n;
    size_t cached; /* the entry whose values are in `values` (n: none) */
    float *values;
} export_state;

/* Plans one tensor of the export: its GPT-2 name and shape, after checking the checkpoint's. */
static int plan_one(export_state *x, const tensor_map *tm, int block) {
    char ours[256], full[300], theirs[256];
    snprintf(ours, sizeof ours, tm->ours, block);
    snprintf(full, sizeof full, "model/%s", ours);
    snprintf(theirs, sizeof theirs, "transformer.");
    snprintf(theirs + strlen(theirs), sizeof theirs - strlen(theirs), tm->theirs, block);
    const mt_ckpt_tensor_meta *t = mt_ckpt_meta_tensor(x->meta, full);
    int64_t want[4];
    int nd = our_shape(&x->cfg, ours, want);
    bool same = t && t->ndim == nd;
    for (int d = 0; same && d < nd; d++) same = t->shape[d] == want[d];
    if (!same) {
        fprintf(stderr, "mt-ckpt: '%s': tensor '%s' %s\n", x->meta->dir, full,
                t ? "has another shape than the configuration gives" : "is missing");
        return -1;
    }
    mt_st_entry *e = &x->entries[x->n];
    x->names[x->n] = strdup(theirs);
    if (!x->names[x->n]) {
        fprintf(stderr, "mt-ckpt: out of memory\n");
        return -1;
    }
    e->name = x->names[x->n];
    e->ndim = their_shape(&x->cfg, tm, want, nd, e->shape);
    x->maps[x->n] = tm;
    x->blocks[x->n] = block;
    x->n++;
    return 0;
}

/* Reads entry i's tensor from the checkpoint and converts it into x->values. */
static mt_status load_entry(export_state *x, size_t i) {
    char ours[256], full[300];
    snprintf(ours, sizeof ours, x->maps[i]->ours, x->blocks[i]);
    snprintf(full, sizeof full, "model/%s", ours);
    const mt_ckpt_tensor_meta *t = mt_ckpt_meta_tensor(x->meta, full);
    int64_t shape[4];
    int nd = our_shape(&x->cfg, ours, shape);
    uint64_t n = numel_of(shape, nd);
    free(x->values);
    x->cached = x->n;
    x->values = malloc(n * sizeof(float));
    /* A tensor in the same layout is read in place; the others through a scratch copy. */
    bool same = x->maps[i]->how == SAME;
    float *raw = same ? x->values : malloc(n * sizeof(float));
    mt_status st = x->values && raw ? MT_OK
                                    : mt_error_set(MT_ERR_OUT_OF_MEMORY, "no memory for tensor "
                                                   "'%s' (%" PRIu64 " values)", full, n);
    if (st == MT_OK) st = mt_ckpt_read_tensor(x->reader, t, raw);
    if (st == MT_OK) {
        if (!same) convert(x->maps[i]->how, shape, raw, x->values, true);
        x->cached = i;
    }
    if (!same) free(raw);
    return st;
}

static mt_status fill_entry(void *user, size_t index, uint64_t first, float *buf, size_t count) {
    export_state *x = user;
    if (x->cached != index) MT_TRY(load_entry(x, index));
    memcpy(buf, x->values + first, count * sizeof(float));
    return MT_OK;
}

int mt_ckpt_cmd_export(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: mt-ckpt export CKPT DIR\n");
        return MT_CKPT_EXIT_USAGE;
    }
    mt_ckpt_meta m;
    int rc = mt_ckpt_tool_open(argv[0], &m);
    if (rc) return rc;
    export_state x = {.meta = &m};
    rc = MT_CKPT_EXIT_FAIL;
    if (mt_ckpt_reader_open(&m, &x.reader) != MT_OK) {
        mt_ckpt_tool_error();
        goto done;
    }
    if (read_config(&m, x.reader, &x.cfg) != 0) goto done;
    size_t total = ROOT_N + BLOCK_N * (size_t)x.cfg.layers;
    x.entries = calloc(total, sizeof *x.entries);
    x.names = calloc(total, sizeof *x.names);
    x.maps = calloc(total, sizeof *x.maps);
    x.blocks = calloc(total, sizeof *x.blocks);
    if (!x.entries || !x.names || !x.maps || !x.blocks) {
        fprintf(stderr, "mt-ckpt: out of memory\n");
        goto done;
    }
    /* GPT-2's order: embeddings, the blocks, the final LayerNorm. */
    if (plan_one(&x, &root_map[0], 0) || plan_one(&x, &root_map[1], 0)) goto done;
    for (int l = 0; l < x.cfg.layers; l++)
        for (size_t i = 0; i < BLOCK_N; i++)
            if (plan_one(&x, &block_map[i], l)) goto done;
    if (plan_one(&x, &root_map[2], 0) || plan_one(&x, &root_map[3], 0)) goto done;
    x.cached = x.n;
    char path[PATH_MAX];
    /* transformers reads safetensors files whose metadata says "pt". */
    const char *meta_kv[] = {"format", "pt"};
    if (mt_ckpt_mkdirs(argv[1]) != MT_OK ||
        mt_ckpt_join(path, sizeof path, argv[1], "model.safetensors") != MT_OK ||
        mt_st_write_filled(path, x.entries, x.n, meta_kv, 1, fill_entry, &x) != MT_OK) {
        mt_ckpt_tool_error();
        goto done;
    }
    if (write_config_json(argv[1], &x.cfg) != 0) goto done;
    printf("exported %s (step %ld): GPT-2 with %d layers, d_model %d, %d heads, %d positions, "
           "vocab %d: %zu tensors -> %s and config.json\n", m.dir, m.step, x.cfg.layers,
           x.cfg.d_model, x.cfg.heads, x.cfg.seq, x.cfg.vocab, x.n, path);
    rc = MT_CKPT_EXIT_OK;
done:
    for (size_t i = 0; i < x.n; i++) free(x.names[i]);
    free(x.entries);
    free(x.names);
    free(x.maps);
    free(x.blocks);
    free(x.values);
    mt_ckpt_reader_close(x.reader);
    mt_ckpt_meta_free(&m);
    return rc;
}

/* ---- import ---------------------------------------------------------------------------------- */

/* The tensor named `rest` under the file's prefix ("transformer." or none). */
static const mt_st_tensor *find(mt_st_file *f, const char *prefix, const char *rest) {
    char name[300];
    snprintf(name, sizeof name, "%s%s", prefix, rest);
    return mt_st_find(f, name);
}

/* config.json beside the file: n_head and the fields that must match what meshtrain runs. */
static int read_hf_config(const char *file, int *heads) {
    char copy[PATH_MAX], path[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", file);
    if (mt_ckpt_join(path, sizeof path, dirname(copy), "config.json") != MT_OK) return -1;
    if (!mt_ckpt_is_file(path)) return 0;
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j) {
        fprintf(stderr, "mt-ckpt: '%s' is not valid JSON: line %d: %s\n", path, jerr.line,
                jerr.text);
        return -1;
    }
    int rc = 0;
    json_t *h = json_object_get(j, "n_head");
    const char *act = json_string_value(json_object_get(j, "activation_function"));
    json_t *inner = json_object_get(j, "n_inner"), *eps = json_object_get(j, "layer_norm_epsilon");
    json_t *tie = json_object_get(j, "tie_word_embeddings");
    if (json_is_integer(h) && *heads == 0) *heads = (int)json_integer_value(h);
    if (act && strcmp(act, "gelu_new") != 0) {
        fprintf(stderr, "mt-ckpt: '%s': activation_function '%s': meshtrain's GPT uses "
                "gelu_new (the tanh approximation)\n", path, act);
        rc = -1;
    }
    if (inner && !json_is_null(inner)) {
        json_t *e = json_object_get(j, "n_embd");
        if (!json_is_integer(e) || json_integer_value(inner) != 4 * json_integer_value(e)) {
            fprintf(stderr, "mt-ckpt: '%s': n_inner must be null or 4 x n_embd\n", path);
            rc = -1;
        }
    }
    if (eps && (!json_is_number(eps) || json_number_value(eps) != 1e-5)) {
        fprintf(stderr, "mt-ckpt: '%s': layer_norm_epsilon must be 1e-5 (meshtrain's)\n", path);
        rc = -1;
    }
    if (tie && json_is_false(tie)) {
        fprintf(stderr, "mt-ckpt: '%s': an untied lm_head is not meshtrain's GPT\n", path);
        rc = -1;
    }
    json_decref(j);
    return rc;
}

typedef struct import_state {
    mt_ckpt_whole_tensor *tensors;
    char **names;
    size_t n;
} import_state;

static int import_one(mt_st_file *f, const char *prefix, const gpt_config *c,
                      const tensor_map *tm, int block, import_state *x) {
    char ours[256], theirs[256];
    snprintf(ours, sizeof ours, tm->ours, block);
    snprintf(theirs, sizeof theirs, tm->theirs, block);
    int64_t shape[4], expect[4];
    int nd = our_shape(c, ours, shape);
    int tnd = their_shape(c, tm, shape, nd, expect);
    const mt_st_tensor *t = find(f, prefix, theirs);
    bool same = t && t->ndim == tnd;
    for (int d = 0; same && d < tnd; d++) same = t->shape[d] == expect[d];
    if (!same) {
        char want[96];
        fprintf(stderr, "mt-ckpt: tensor '%s%s' %s (expected shape %s)\n", prefix, theirs,
                t ? "has another shape" : "is missing",
                mt_ckpt_dims_text(expect, tnd, want, sizeof want));
        return -1;
    }
    uint64_t n = numel_of(shape, nd);
    /* A tensor in the same layout is kept as read; the others are converted into out. */
    float *in = malloc(n * sizeof(float)), *out = tm->how == SAME ? in : malloc(n * sizeof(float));
    if (!in || !out) {
        free(in);
        if (out != in) free(out);
        fprintf(stderr, "mt-ckpt: no memory for tensor '%s' (%" PRIu64 " values)\n", theirs, n);
        return -1;
    }
    if (mt_st_read_f32(f, t, in) != MT_OK) {
        mt_ckpt_tool_error();
        free(in);
        if (out != in) free(out);
        return -1;
    }
    if (out != in) {
        convert(tm->how, shape, in, out, false);
        free(in);
    }
    char full[300];
    snprintf(full, sizeof full, "model/%s", ours);
    x->names[x->n] = strdup(full);
    if (!x->names[x->n]) {
        fprintf(stderr, "mt-ckpt: out of memory\n");
        free(out);
        return -1;
    }
    mt_ckpt_whole_tensor *w = &x->tensors[x->n++];
    w->name = x->names[x->n - 1];
    w->ndim = nd;
    memcpy(w->shape, shape, sizeof w->shape);
    w->tp_dim = tm->tp_dim;
    w->data = out;
    return 0;
}

/* Every tensor of the file must be one that was imported, or one GPT-2 files carry besides the
 * weights: the attention masks (buffers) and the tied head. */
static int check_leftovers(mt_st_file *f, const char *prefix) {
    const mt_st_header *h = mt_st_file_header(f);
    size_t pl = strlen(prefix);
    for (size_t i = 0; i < h->n_tensors; i++) {
        const char *name = h->tensors[i].name;
        const char *rest = strncmp(name, prefix, pl) == 0 ? name + pl : name;
        size_t len = strlen(rest);
        if (!strcmp(name, "lm_head.weight") || (len > 10 && !strcmp(rest + len - 10, ".attn.bias")) ||
            (len > 17 && !strcmp(rest + len - 17, ".attn.masked_bias")))
            continue;
        bool known = false;
        for (size_t k = 0; k < ROOT_N && !known; k++) known = !strcmp(rest, root_map[k].theirs);
        int block;
        char tail[200];
        if (!known && sscanf(rest, "h.%d.%199s", &block, tail) == 2)
            for (size_t k = 0; k < BLOCK_N && !known; k++)
                known = !strcmp(tail, block_map[k].theirs + strlen("h.%d."));
        if (!known) {
            fprintf(stderr, "mt-ckpt: tensor '%s' is not part of a GPT-2 model that meshtrain "
                    "runs\n", name);
            return -1;
        }
    }
    return 0;
}

/* lm_head.weight, when the file has it, must be wte (GPT-2 ties them). */
static int check_tied_head(mt_st_file *f, const char *prefix, const mt_ckpt_whole_tensor *wte) {
    const mt_st_tensor *head = mt_st_find(f, "lm_head.weight");
    if (!head) return 0;
    uint64_t n = numel_of(wte->shape, wte->ndim);
    if (head->ndim != 2 || head->shape[0] != wte->shape[0] || head->shape[1] != wte->shape[1]) {
        fprintf(stderr, "mt-ckpt: lm_head.weight has another shape than %swte.weight\n", prefix);
        return -1;
    }
    float *v = malloc(n * sizeof(float));
    if (!v || mt_st_read_f32(f, head, v) != MT_OK) {
        if (v) mt_ckpt_tool_error();
        free(v);
        return -1;
    }
    int rc = memcmp(v, wte->data, n * sizeof(float)) == 0 ? 0 : -1;
    free(v);
    if (rc)
        fprintf(stderr, "mt-ckpt: lm_head.weight differs from %swte.weight: meshtrain's GPT ties "
                "them\n", prefix);
    return rc;
}

int mt_ckpt_cmd_import(int argc, char **argv) {
    int heads = 0;
    long step = 0;
    const char *file = NULL, *dir = NULL;
    for (int i = 0; i < argc; i++) {
        char *end;
        if (!strcmp(argv[i], "--heads") && i + 1 < argc) {
            heads = (int)strtol(argv[++i], &end, 10);
            if (*end || heads < 1) {
                fprintf(stderr, "mt-ckpt: --heads '%s' must be a positive integer\n", argv[i]);
                return MT_CKPT_EXIT_USAGE;
            }
        } else if (!strcmp(argv[i], "--step") && i + 1 < argc) {
            step = strtol(argv[++i], &end, 10);
            if (*end || step < 0 || step > 99999999) {
                fprintf(stderr, "mt-ckpt: --step '%s' must be in [0, 99999999]\n", argv[i]);
                return MT_CKPT_EXIT_USAGE;
            }
        } else if (!file) {
            file = argv[i];
        } else if (!dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "usage: mt-ckpt import FILE DIR [--heads N] [--step S]\n");
            return MT_CKPT_EXIT_USAGE;
        }
    }
    if (!file || !dir) {
        fprintf(stderr, "usage: mt-ckpt import FILE DIR [--heads N] [--step S]\n");
        return MT_CKPT_EXIT_USAGE;
    }
    mt_st_file *f = NULL;
    if (mt_st_open(file, &f) != MT_OK) {
        mt_ckpt_tool_error();
        return MT_CKPT_EXIT_FAIL;
    }
    int rc = MT_CKPT_EXIT_FAIL;
    import_state x = {0};
    const char *prefix = mt_st_find(f, "transformer.wte.weight") ? "transformer." : "";
    const mt_st_tensor *wte = find(f, prefix, "wte.weight"), *wpe = find(f, prefix, "wpe.weight");
    gpt_config c = {0};
    if (read_hf_config(file, &heads) != 0) goto done;
    if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2 || wte->shape[1] != wpe->shape[1]) {
        fprintf(stderr, "mt-ckpt: '%s' is not a GPT-2 model: no [vocab, C] wte.weight and "
                "[positions, C] wpe.weight\n", file);
        goto done;
    }
    c.vocab = (int)wte->shape[0];
    c.d_model = (int)wte->shape[1];
    c.seq = (int)wpe->shape[0];
    while (true) {
        char probe[64];
        snprintf(probe, sizeof probe, "h.%d.ln_1.weight", c.layers);
        if (!find(f, prefix, probe)) break;
        c.layers++;
    }
    c.heads = heads;
    if (c.layers < 1 || heads < 1 || c.d_model % heads != 0) {
        fprintf(stderr, "mt-ckpt: '%s': %d layers, d_model %d, heads %d (no config.json beside "
                "the file? give --heads): heads must divide d_model\n", file, c.layers, c.d_model,
                heads);
        goto done;
    }
    size_t total = ROOT_N + BLOCK_N * (size_t)c.layers;
    x.tensors = calloc(total, sizeof *x.tensors);
    x.names = calloc(total, sizeof *x.names);
    if (!x.tensors || !x.names) {
        fprintf(stderr, "mt-ckpt: out of memory\n");
        goto done;
    }
    for (size_t i = 0; i < ROOT_N; i++)
        if (import_one(f, prefix, &c, &root_map[i], 0, &x)) goto done;
    for (int l = 0; l < c.layers; l++)
        for (size_t i = 0; i < BLOCK_N; i++)
            if (import_one(f, prefix, &c, &block_map[i], l, &x)) goto done;
    if (check_leftovers(f, prefix) || check_tied_head(f, prefix, &x.tensors[0])) goto done;
    char config[256];
    snprintf(config, sizeof config, CONFIG_FORMAT, c.layers, c.d_model, c.heads, c.seq, c.vocab);
    mt_ckpt_whole_extra ex = {CONFIG_EXTRA, config, strlen(config)};
    if (mt_ckpt_write_whole(dir, step, x.tensors, x.n, &ex, 1) != MT_OK) {
        mt_ckpt_tool_error();
        goto done;
    }
    printf("imported %s: GPT-2 with %d layers, d_model %d, %d heads, %d positions, vocab %d -> "
           "%s/step-%08ld (model only; train_gpt --resume %s starts from it with a fresh "
           "optimizer)\n", file, c.layers, c.d_model, c.heads, c.seq, c.vocab, dir, step, dir);
    rc = MT_CKPT_EXIT_OK;
done:
    for (size_t i = 0; i < x.n; i++) {
        free(x.names[i]);
        free((void *)x.tensors[i].data);
    }
    free(x.tensors);
    free(x.names);
    mt_st_close(f);
    return rc;
}
