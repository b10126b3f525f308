/* The GPT's gradients against finite differences, on one rank (run through mtrun, see
 * tp_gpt.cmake).
 *
 * The model (layers 2, d_model 16, heads 4, seq 8, batch 2) is one FSDP unit (the root only, on
 * a mesh {"dp"} of one rank, resharded after every forward) so that its f32 master shard is the
 * whole flat parameter buffer: the test perturbs elements there and the next forward gathers
 * them. The parameters are first moved away from GPT-2's initialisation by uniform noise of
 * +-0.2 so that attention is not uniform, GELU not linear and LayerNorm gains not 1: a wrong
 * backward term cannot hide behind a tiny activation. For every parameter tensor, its 3 largest
 * gradient elements and 3 more picked by a hash are compared with central differences of the
 * forward-only loss (eps 1e-2); each difference must be within 2e-2 of the element's magnitude
 * plus 1e-2 of the tensor's largest (f32 losses give the differences ~1e-5 of noise). Also:
 * grad_scale scales the gradient, and tokens outside the vocabulary are an error naming them. */
#include "fsdp/fsdp_internal.h"

#include "check.h"
#include "numeric.h"

#include <meshtrain/meshtrain.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LAYERS = 2, D_MODEL = 16, HEADS = 4, SEQ = 8, BATCH = 2, PICKS = 6 };
static const float EPS = 1e-2f;

static double uniform_pm1(uint64_t key) {
    return (double)(test_mix64(key) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
}

#define TRY(call)                                                                                  \
    do {                                                                                           \
        mt_status s_ = (call);                                                                     \
        if (s_ != MT_OK) {                                                                         \
            fprintf(stderr, "%s failed: %s\n", #call, mt_last_error());                            \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static bool picked(const size_t *idx, int n, size_t k) {
    for (int i = 0; i < n; i++)
        if (idx[i] == k) return true;
    return false;
}

/* The elements to check in one tensor: the largest gradients, then hashed positions. */
static int pick_elements(const float *g, size_t n, int param_no, size_t *idx) {
    int count = 0;
    for (int r = 0; r < PICKS / 2 && (size_t)count < n; r++) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < n; i++)
            if (!picked(idx, count, i) && (best == SIZE_MAX || fabsf(g[i]) > fabsf(g[best])))
                best = i;
        idx[count++] = best;
    }
    for (int r = 0; count < PICKS && (size_t)count < n && r < 100; r++) {
        size_t k = (size_t)(test_mix64(((uint64_t)param_no << 32) + (uint64_t)r) % n);
        if (!picked(idx, count, k)) idx[count++] = k;
    }
    return count;
}

static int check_param(mt_gpt *gpt, const int *tokens, mt_fsdp_unit *u, mt_param *p,
                       int param_no, const float *grad) {
    size_t n = mt_param_numel(p), offset = mt_fsdp_param_offset(u, (size_t)param_no);
    const float *g = grad + offset;
    float gmax = 0.0f;
    for (size_t i = 0; i < n; i++) gmax = fmaxf(gmax, fabsf(g[i]));
    CHECK_MSG(gmax > 0.0f, "'%s': the gradient is all zero", mt_param_name(p));
    size_t idx[PICKS];
    int count = pick_elements(g, n, param_no, idx);
    double worst = 0.0;
    for (int j = 0; j < count; j++) {
        float *x = u->master + offset + idx[j];
        float orig = *x, lp = 0.0f, lm = 0.0f;
        *x = orig + EPS;
        TRY(mt_gpt_forward(gpt, tokens, BATCH, &lp));
        *x = orig - EPS;
        TRY(mt_gpt_forward(gpt, tokens, BATCH, &lm));
        *x = orig;
        double fd = ((double)lp - (double)lm) / (2.0 * EPS);
        double an = g[idx[j]], err = fabs(fd - an);
        double tol = 2e-2 * fabs(an) + 1e-2 * gmax;
        CHECK_MSG(err <= tol, "'%s'[%zu]: backward %.6g, finite difference %.6g (error %.3g > "
                  "%.3g)", mt_param_name(p), idx[j], an, fd, err, tol);
        if (err / (fabs(an) + gmax) > worst) worst = err / (fabs(an) + gmax);
    }
    printf("  %-20s %6zu values, grad max %.3e, %d checked, worst error / (|g| + max) %.2e\n",
           mt_param_name(p), n, gmax, count, worst);
    return 0;
}

static int run(mt_mesh *mesh) {
    mt_gpt_config cfg = {.layers = LAYERS, .d_model = D_MODEL, .heads = HEADS, .seq = SEQ,
                         .vocab = 256, .seed = 7};
    mt_gpt *gpt = NULL;
    TRY(mt_gpt_create(mesh, &cfg, &gpt));
    mt_fsdp_options o = mt_fsdp_defaults(mesh, "dp");
    o.reshard_after_forward = 1; /* every forward gathers the (perturbed) master again */
    TRY(mt_fsdp_shard(mt_gpt_root(gpt), &o));
    mt_module *root = mt_gpt_root(gpt);
    mt_fsdp_unit *u = mt_fsdp_unit_of(root);
    CHECK(u && u->nranks == 1 && u->param_dtype == MT_F32);
    if (!u) return 1;
    CHECK_MSG(u->n_params == (size_t)(4 + 12 * LAYERS), "the unit holds %zu parameters",
              u->n_params);

    for (size_t i = 0; i < u->S; i++) u->master[i] += (float)(0.2 * uniform_pm1(1000003 + i));
    int tokens[BATCH * (SEQ + 1)];
    for (int i = 0; i < BATCH * (SEQ + 1); i++)
        tokens[i] = (int)(test_mix64(77 + (uint64_t)i) % 256);

    float loss = 0.0f, eval = 0.0f;
    TRY(mt_gpt_forward_backward(gpt, tokens, BATCH, 1.0f, &loss));
    TRY(mt_gpt_forward(gpt, tokens, BATCH, &eval));
    printf("loss %.7g (ln 256 = %.7g), forward-only %.7g\n", loss, log(256.0), eval);
    CHECK_MSG(loss == eval, "training loss %.9g, forward-only loss %.9g", loss, eval);
    CHECK_MSG(loss > 1.0f && loss < 20.0f, "implausible loss %g", loss);
    float *grad = malloc(u->S * sizeof *grad);
    if (!grad) return 1;
    memcpy(grad, u->grad_shard, u->S * sizeof *grad);

    /* grad_scale multiplies the gradient and leaves the loss alone. */
    TRY(mt_zero_grad(root));
    float loss2 = 0.0f;
    TRY(mt_gpt_forward_backward(gpt, tokens, BATCH, 0.25f, &loss2));
    CHECK_MSG(loss2 == loss, "loss %.9g with grad_scale 0.25, %.9g with 1", loss2, loss);
    double worst_scale = 0.0;
    for (size_t i = 0; i < u->S; i++)
        worst_scale = fmax(worst_scale, fabs(u->grad_shard[i] - 0.25 * grad[i]));
    float gall = 0.0f;
    for (size_t i = 0; i < u->S; i++) gall = fmaxf(gall, fabsf(grad[i]));
    CHECK_MSG(worst_scale <= 1e-6 * gall, "grad_scale 0.25: off by %.3g (gradient max %.3g)",
              worst_scale, gall);

    for (size_t i = 0; i < u->n_params; i++)
        if (check_param(gpt, tokens, u, u->params[i], (int)i, grad)) return 1;

    /* A token outside the vocabulary is refused before any work, naming it. */
    tokens[3] = 256;
    mt_status st = mt_gpt_forward(gpt, tokens, BATCH, &eval);
    CHECK_MSG(st == MT_ERR_INVALID_ARG && strstr(mt_last_error(), "token 256"),
              "a token of 256 gave status %d: %s", (int)st, mt_last_error());
    free(grad);
    mt_gpt_destroy(gpt);
    return 0;
}

int main(int argc, char **argv) {
    mt_runtime *rt = NULL;
    TRY(mt_init(&rt, &argc, &argv));
    if (mt_runtime_world_size(rt) != 1) {
        fprintf(stderr, "test_gpt_grad runs on one rank\n");
        mt_finalize(rt);
        return 2;
    }
    mt_mesh *mesh = NULL;
    const char *names[1] = {"dp"};
    TRY(mt_mesh_create(rt, 1, (int[]){1}, names, &mesh));
    int rc = run(mesh);
    mt_mesh_destroy(mesh);
    mt_finalize(rt);
    return rc ? rc : check_report("test_gpt_grad");
}
