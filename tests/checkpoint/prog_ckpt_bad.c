/* Damaged checkpoints are refused cleanly (tests/checkpoint/ckpt_bad_files.sh drives it through
 * mtrun). Public API only: this is what a program sees.
 *
 *   prog_ckpt_bad save DIR DP TP        a small GPT (seed 1) trains 2 steps and is saved into DIR
 *                                       (synchronously, with two extras: "config", saved once,
 *                                       and "rank_state", per rank); each rank writes its eval
 *                                       loss's bits to DIR.eval-<rank>; checks
 *                                       mt_checkpoint_read_extra, and that a save inside a
 *                                       forward is refused
 *   prog_ckpt_bad check DIR CASES DP TP every line of CASES, "name<TAB>path<TAB>text<TAB>...", is
 *                                       a damaged copy of DIR: loading it must fail on every rank
 *                                       with a message holding every text, and leave the model,
 *                                       the optimizer and the extras as they were; a model of
 *                                       another d_model is refused; then DIR loads, exactly
 *   prog_ckpt_bad world DIR DP TP       on another world size: the per-rank extra is refused,
 *                                       the rest loads (resharded)
 *
 * The model that meets the damaged files is not the saved one (seed 2, one step): a load that
 * wrote anything before failing would show in its eval loss, compared bit for bit. */
#include "check.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "prog_ckpt_bad"
#define LAYERS 2
#define HEADS 4
#define SEQ 16
#define BATCH 4
#define D_MODEL 32
#define SAVED_STEPS 2
#define RANK_STATE_BASE 1000 /* rank r saves RANK_STATE_BASE + r as its "rank_state" */
#define CONFIG_TEXT "prog_ckpt_bad gpt layers 2 heads 4 seq 16"

typedef struct model {
    mt_mesh *mesh;
    mt_gpt *gpt;
    mt_adamw *adam;
    int dp_rank;
} model;

static void model_free(model *m) {
    if (m->adam) mt_adamw_destroy(m->adam);
    if (m->gpt) mt_gpt_destroy(m->gpt);
    if (m->mesh) mt_mesh_destroy(m->mesh);
    memset(m, 0, sizeof *m);
}

/* As train_gpt builds it: each block a unit, then the root, sharded over "dp"; AdamW after. */
static mt_status model_build(mt_runtime *rt, int dp, int tp, int d_model, uint64_t seed,
                             model *m) {
    memset(m, 0, sizeof *m);
    MT_TRY(mt_mesh_create(rt, 2, (int[]){dp, tp}, (const char *[]){"dp", "tp"}, &m->mesh));
    m->dp_rank = mt_mesh_coord(m->mesh, 0);
    mt_gpt_config cfg = {.layers = LAYERS, .d_model = d_model, .heads = HEADS, .seq = SEQ,
                         .vocab = 256, .seed = seed};
    MT_TRY(mt_gpt_create(m->mesh, &cfg, &m->gpt));
    mt_fsdp_options fo = mt_fsdp_defaults(m->mesh, "dp");
    for (int l = 0; l < LAYERS; l++) MT_TRY(mt_fsdp_shard(mt_gpt_block(m->gpt, l), &fo));
    MT_TRY(mt_fsdp_shard(mt_gpt_root(m->gpt), &fo));
    mt_adamw_options ao = {.lr = 1e-2f};
    return mt_adamw_create(mt_gpt_root(m->gpt), &ao, &m->adam);
}

/* Token batches: a fixed pattern per (step, dp rank); eval (step -1) is the same on every rank,
 * so every layout evaluates the same sequences. */
static void fill_tokens(int *tokens, int step, int dp_rank) {
    for (int b = 0; b < BATCH; b++)
        for (int i = 0; i <= SEQ; i++) {
            unsigned v = (unsigned)(i * 7 + b * 31 + (step + 1) * 13 + dp_rank * 101);
            tokens[b * (SEQ + 1) + i] = (int)((v * 2654435761u) >> 24);
        }
}

static mt_status train(model *m, int steps) {
    int tokens[BATCH * (SEQ + 1)];
    for (int s = 0; s < steps; s++) {
        float loss;
        fill_tokens(tokens, s, m->dp_rank);
        MT_TRY(mt_gpt_forward_backward(m->gpt, tokens, BATCH, 1.0f, &loss));
        MT_TRY(mt_adamw_step(m->adam));
        MT_TRY(mt_zero_grad(mt_gpt_root(m->gpt)));
    }
    return MT_OK;
}

static float eval_loss(model *m) {
    int tokens[BATCH * (SEQ + 1)];
    fill_tokens(tokens, -1, 0);
    float loss = NAN;
    CHECK_OK(mt_gpt_forward(m->gpt, tokens, BATCH, &loss));
    return loss;
}

/* The optimizer's state on this rank, copied to the host (every unit's m then v). */
typedef struct opt_copy {
    float *data;
    size_t n;
    long steps;
} opt_copy;

static mt_status opt_snapshot(mt_runtime *rt, mt_adamw *adam, opt_copy *out) {
    mt_device *dev = mt_runtime_device(rt);
    size_t total = 0;
    for (size_t u = 0; u < mt_adamw_unit_count(adam); u++) {
        float *m, *v;
        size_t n;
        MT_TRY(mt_adamw_state(adam, u, &m, &v, &n));
        total += 2 * n;
    }
    out->data = malloc((total ? total : 1) * sizeof(float));
    out->n = total;
    out->steps = mt_adamw_steps(adam);
    if (!out->data) return mt_error_set(MT_ERR_OUT_OF_MEMORY, "no memory for the snapshot");
    size_t at = 0;
    for (size_t u = 0; u < mt_adamw_unit_count(adam); u++) {
        float *m, *v;
        size_t n;
        MT_TRY(mt_adamw_state(adam, u, &m, &v, &n));
        MT_TRY(mt_device_copy(dev, out->data + at, m, n * sizeof(float), MT_COPY_DEVICE_TO_HOST,
                              NULL));
        MT_TRY(mt_device_copy(dev, out->data + at + n, v, n * sizeof(float),
                              MT_COPY_DEVICE_TO_HOST, NULL));
        at += 2 * n;
    }
    return MT_OK;
}

static bool opt_same(mt_runtime *rt, mt_adamw *adam, const opt_copy *before) {
    opt_copy now = {0};
    bool same = opt_snapshot(rt, adam, &now) == MT_OK && now.n == before->n &&
                now.steps == before->steps &&
                memcmp(now.data, before->data, now.n * sizeof(float)) == 0;
    free(now.data);
    return same;
}

/* The program's extras: the configuration text (saved once) and this rank's own value. */
typedef struct extras {
    char config[64];
    int64_t rank_state;
    mt_checkpoint_extra list[2];
} extras;

static void extras_init(extras *e, const char *config, int64_t rank_state) {
    memset(e, 0, sizeof *e);
    snprintf(e->config, sizeof e->config, "%s", config);
    e->rank_state = rank_state;
    e->list[0] = (mt_checkpoint_extra){"config", e->config, sizeof e->config, false};
    e->list[1] = (mt_checkpoint_extra){"rank_state", &e->rank_state, sizeof e->rank_state, true};
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void eval_path(char *buf, size_t cap, const char *dir, int rank) {
    snprintf(buf, cap, "%s.eval-%d", dir, rank);
}

/* The eval loss this rank saw right after saving, as bits. */
static float saved_eval(const char *dir, int rank) {
    char path[4096];
    eval_path(path, sizeof path, dir, rank);
    FILE *f = fopen(path, "r");
    unsigned bits = 0;
    float v = NAN;
    CHECK_MSG(f && fscanf(f, "%x", &bits) == 1, "cannot read '%s'", path);
    if (f) fclose(f);
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* ---- save ---------------------------------------------------------------------------------- */

/* A hook on the root, after FSDP's: it runs inside the forward, with the parameters gathered,
 * where a save must be refused. */
typedef struct save_attempt {
    const char *dir;
    mt_status st;
    char msg[1024];
} save_attempt;

static mt_status save_in_forward(mt_module *root, void *user) {
    save_attempt *a = user;
    mt_checkpoint_options o = mt_checkpoint_defaults();
    o.sync = true;
    o.step = 99;
    a->st = mt_checkpoint_save(root, NULL, a->dir, &o);
    snprintf(a->msg, sizeof a->msg, "%s", mt_last_error());
    mt_clear_error();
    return MT_OK;
}

static void run_save(mt_runtime *rt, const char *dir, int dp, int tp) {
    int rank = mt_runtime_rank(rt);
    model m;
    CHECK_OK(model_build(rt, dp, tp, D_MODEL, 1, &m));
    CHECK_OK(train(&m, SAVED_STEPS));
    /* Evaluated before saving, as a training loop does: the root keeps its full parameters
     * after a forward without a backward, which must not stop a save. */
    float loss = eval_loss(&m);
    CHECK(isfinite(loss));
    extras ex;
    extras_init(&ex, CONFIG_TEXT, RANK_STATE_BASE + rank);
    mt_checkpoint_options o = mt_checkpoint_defaults();
    o.sync = true;
    o.extras = ex.list;
    o.n_extras = 2;
    CHECK_OK(mt_checkpoint_save(mt_gpt_root(m.gpt), m.adam, dir, &o));
    CHECK(same_bits(eval_loss(&m), loss)); /* saving changes nothing */
    char path[4096];
    eval_path(path, sizeof path, dir, rank);
    FILE *f = fopen(path, "w");
    unsigned bits;
    memcpy(&bits, &loss, sizeof bits);
    CHECK_MSG(f && fprintf(f, "%08x\n", bits) > 0, "cannot write '%s'", path);
    if (f) fclose(f);

    /* mt_checkpoint_read_extra: the value saved once, byte for byte; a per-rank one and an
     * unknown one refused with their names. */
    void *data = NULL;
    size_t bytes = 0;
    CHECK_OK(mt_checkpoint_read_extra(dir, "config", &data, &bytes));
    CHECK(data && bytes == sizeof ex.config && memcmp(data, ex.config, bytes) == 0);
    free(data);
    data = NULL;
    CHECK(mt_checkpoint_read_extra(dir, "rank_state", &data, &bytes) != MT_OK);
    CHECK_MSG(strstr(mt_last_error(), "extra 'rank_state' is per rank"), "got: %s",
              mt_last_error());
    CHECK(data == NULL);
    CHECK(mt_checkpoint_read_extra(dir, "nope", &data, &bytes) == MT_ERR_NOT_FOUND);
    CHECK_MSG(strstr(mt_last_error(), "has no extra state 'nope'"), "got: %s", mt_last_error());
    mt_clear_error();
    char found_path[4096];
    bool found = false;
    CHECK_OK(mt_checkpoint_resolve(dir, found_path, sizeof found_path, &found));
    CHECK(found && strstr(found_path, "step-00000002") != NULL);

    static const char owner = 0;
    save_attempt attempt = {dir, MT_OK, ""};
    const mt_module_hooks hooks = {.pre_forward = save_in_forward};
    CHECK_OK(mt_module_add_hooks(mt_gpt_root(m.gpt), &owner, &hooks, &attempt));
    CHECK(same_bits(eval_loss(&m), loss));
    CHECK_OK(mt_module_remove_hooks(mt_gpt_root(m.gpt), &owner));
    CHECK_MSG(attempt.st == MT_ERR_INVALID_ARG &&
              strstr(attempt.msg, "forward or backward: save and load between steps"),
              "a save inside the forward: %s: %s", mt_status_str(attempt.st), attempt.msg);
    CHECK_OK(mt_checkpoint_resolve(dir, found_path, sizeof found_path, &found));
    CHECK(found && strstr(found_path, "step-00000002") != NULL);
    if (rank == 0) printf(PROG ": saved step 2 into %s; eval loss %.9g\n", dir, (double)loss);
    model_free(&m);
}

/* ---- check --------------------------------------------------------------------------------- */

/* One damaged checkpoint: refused with every text of `want`, nothing changed. */
static void expect_refused(mt_runtime *rt, model *m, const char *name, const char *path,
                           char **want, int n_want, float loss_before, const opt_copy *opt_before) {
    int rank = mt_runtime_rank(rt);
    extras ex;
    extras_init(&ex, "untouched", -1);
    mt_checkpoint_info info = {.step = -7};
    int failed = check_failed_;
    mt_status st = mt_checkpoint_load(mt_gpt_root(m->gpt), m->adam, path, ex.list, 2, &info);
    char msg[4096];
    snprintf(msg, sizeof msg, "%s", mt_last_error());
    mt_clear_error();
    CHECK_MSG(st != MT_OK, "rank %d: case %s: loading '%s' succeeded", rank, name, path);
    for (int i = 0; i < n_want; i++)
        CHECK_MSG(strstr(msg, want[i]) != NULL, "rank %d: case %s:\n  got:  %s\n  want: ...%s...",
                  rank, name, msg, want[i]);
    float loss = eval_loss(m);
    CHECK_MSG(same_bits(loss, loss_before), "rank %d: case %s: the model changed: eval loss "
              "%.9g, before the load %.9g", rank, name, (double)loss, (double)loss_before);
    CHECK_MSG(opt_same(rt, m->adam, opt_before), "rank %d: case %s: the optimizer changed", rank,
              name);
    CHECK_MSG(strcmp(ex.config, "untouched") == 0 && ex.rank_state == -1 && info.step == -7,
              "rank %d: case %s: the extras or the info were written", rank, name);
    if (rank == 0 && check_failed_ == failed) printf("ok: %s refused: %s\n", name, msg);
}

/* CASES: one line per damaged copy, tab-separated: name, path, the texts its message must hold. */
static void check_cases(mt_runtime *rt, model *m, const char *cases, float loss_before,
                        const opt_copy *opt_before) {
    FILE *f = fopen(cases, "r");
    CHECK_MSG(f != NULL, "cannot read '%s'", cases);
    if (!f) return;
    char line[8192];
    int n_cases = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *fields[16];
        int n = 0;
        for (char *save = NULL, *tok = strtok_r(line, "\t", &save); tok && n < 16;
             tok = strtok_r(NULL, "\t", &save))
            fields[n++] = tok;
        if (n == 0) continue;
        CHECK_MSG(n >= 3, "a case needs a name, a path and a text: '%s'", fields[0]);
        if (n < 3) continue;
        expect_refused(rt, m, fields[0], fields[1], fields + 2, n - 2, loss_before, opt_before);
        n_cases++;
    }
    fclose(f);
    CHECK_MSG(n_cases >= 10, "only %d cases in '%s'", n_cases, cases);
}

static void run_check(mt_runtime *rt, const char *dir, const char *cases, int dp, int tp) {
    int rank = mt_runtime_rank(rt);
    model m;
    CHECK_OK(model_build(rt, dp, tp, D_MODEL, 2, &m));
    CHECK_OK(train(&m, 1));
    float loss0 = eval_loss(&m), saved = saved_eval(dir, rank);
    /* Otherwise a load that wrote the saved values before failing would go unseen. */
    CHECK_MSG(!same_bits(loss0, saved), "the live model's eval loss %.9g equals the saved one's",
              (double)loss0);
    opt_copy before = {0};
    CHECK_OK(opt_snapshot(rt, m.adam, &before));
    check_cases(rt, &m, cases, loss0, &before);

    /* The intact checkpoint into a model of another width: refused, that model unchanged. */
    model wide;
    CHECK_OK(model_build(rt, dp, tp, D_MODEL + 16, 3, &wide));
    CHECK_OK(train(&wide, 1));
    float wide_loss = eval_loss(&wide);
    opt_copy wide_before = {0};
    CHECK_OK(opt_snapshot(rt, wide.adam, &wide_before));
    char *want_wide[] = {"has shape", "in the checkpoint and", "in the model", "model/"};
    expect_refused(rt, &wide, "other_d_model", dir, want_wide, 4, wide_loss, &wide_before);
    free(wide_before.data);
    model_free(&wide);

    /* The intact one loads, exactly: the eval loss of the saved model, the step, the extras.
     * The model was just evaluated, so its root holds full parameters that the load must
     * replace, not only its shards. */
    CHECK(same_bits(eval_loss(&m), loss0)); /* the other model changed nothing here either */
    int failed = check_failed_;
    extras ex;
    extras_init(&ex, "", -1);
    mt_checkpoint_info info;
    CHECK_OK(mt_checkpoint_load(mt_gpt_root(m.gpt), m.adam, dir, ex.list, 2, &info));
    CHECK(info.step == SAVED_STEPS && info.has_optimizer && strstr(info.path, "step-00000002"));
    CHECK(mt_adamw_steps(m.adam) == SAVED_STEPS);
    CHECK_MSG(strcmp(ex.config, CONFIG_TEXT) == 0, "config '%s'", ex.config);
    CHECK_MSG(ex.rank_state == RANK_STATE_BASE + rank, "rank_state %lld", (long long)ex.rank_state);
    float loss = eval_loss(&m);
    CHECK_MSG(same_bits(loss, saved), "rank %d: after loading the intact checkpoint: eval loss "
              "%.9g, saved %.9g", rank, (double)loss, (double)saved);
    if (rank == 0 && check_failed_ == failed)
        printf("ok: the intact checkpoint loads: eval loss %.9g as saved\n", (double)loss);
    free(before.data);
    model_free(&m);
}

/* ---- world: another world size ------------------------------------------------------------- */

static void run_world(mt_runtime *rt, const char *dir, int dp, int tp) {
    int rank = mt_runtime_rank(rt), world = mt_runtime_world_size(rt);
    model m;
    CHECK_OK(model_build(rt, dp, tp, D_MODEL, 2, &m));
    CHECK_OK(train(&m, 1));
    float loss0 = eval_loss(&m), saved = saved_eval(dir, 0);
    opt_copy before = {0};
    CHECK_OK(opt_snapshot(rt, m.adam, &before));
    char job[64];
    snprintf(job, sizeof job, "this job has %d ranks", world);
    char *want[] = {"extra 'rank_state'", job};
    expect_refused(rt, &m, "per_rank_extra_other_world", dir, want, 2, loss0, &before);

    /* Without it, the model, the optimizer and the shared extra reshard onto this layout. */
    int failed = check_failed_;
    extras ex;
    extras_init(&ex, "", -1);
    mt_checkpoint_info info;
    CHECK_OK(mt_checkpoint_load(mt_gpt_root(m.gpt), m.adam, dir, ex.list, 1, &info));
    CHECK(info.step == SAVED_STEPS && mt_adamw_steps(m.adam) == SAVED_STEPS);
    CHECK_MSG(strcmp(ex.config, CONFIG_TEXT) == 0, "config '%s'", ex.config);
    float loss = eval_loss(&m);
    /* Another layout sums in another order: ~1e-7 relative. */
    CHECK_MSG(fabsf(loss - saved) <= 1e-5f * fabsf(saved), "rank %d: eval loss %.9g after "
              "resharding, saved %.9g", rank, (double)loss, (double)saved);
    if (rank == 0 && check_failed_ == failed) printf("ok: loaded on %d ranks (dp %d x tp %d): eval loss %.9g, saved %.9g\n",
                          world, dp, tp, (double)loss, (double)saved);
    free(before.data);
    model_free(&m);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    bool check = strcmp(mode, "check") == 0;
    int want_args = check ? 6 : 5;
    if (argc != want_args || (!check && strcmp(mode, "save") && strcmp(mode, "world"))) {
        fprintf(stderr, "usage: " PROG " save|world DIR DP TP | check DIR CASES DP TP\n");
        return 2;
    }
    int dp = atoi(argv[argc - 2]), tp = atoi(argv[argc - 1]);
    mt_runtime *rt = NULL;
    CHECK_OK(mt_init(&rt, &argc, &argv));
    if (!rt) return check_report(PROG);
    if (strcmp(mode, "save") == 0) run_save(rt, argv[2], dp, tp);
    else if (check) run_check(rt, argv[2], argv[3], dp, tp);
    else run_world(rt, argv[2], dp, tp);
    mt_finalize(rt);
    return check_report(PROG);
}
