/* The host AdamW (core/cpu/adamw_host.c): every instruction-set path this CPU has, on 1, 2, 3 and
 * 7 threads, bit for bit against the scalar loop mt_op_adamw ran before the host AdamW existed
 * (copied below, so that a change of the kernels cannot move the reference with them), over
 * ragged sizes, weight decay on and off, bias corrections at steps 1 and 1000, and three chained
 * steps; a deferred clipping factor (mt_host_adamw_scaled) against the gradient scaled first,
 * then the reference, with the gradient left as it was; mt_op_adamw on the CPU device under each
 * MT_ADAMW_ISA; MT_ADAMW_ISA's errors. */
#include "check.h"
#include "numeric.h"

#include "core/cpu/adamw_host.h"
#include "core/thread_pool.h"

#include <meshtrain/device.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0xada3f00dULL;

/* mt_cpu_op_adamw as it was before core/cpu/adamw_host.c (tests are built with ISO C, hence
 * without FMA contraction, like the library's kernels). */
static void reference(float *param, const float *grad, float *m, float *v, size_t n, long t,
                      float lr, float beta1, float beta2, float eps, float weight_decay) {
    float c1 = (float)(1.0 / (1.0 - pow((double)beta1, (double)t)));
    float c2 = (float)(1.0 / (1.0 - pow((double)beta2, (double)t)));
    float decay = lr * weight_decay;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = param[i];
        param[i] = p - lr * (mi * c1) / (sqrtf(vi * c2) + eps) - decay * p;
    }
}

typedef struct state {
    float *p, *g, *m, *v;
} state;

static state state_new(size_t n) {
    state s = {test_lcg_floats(&rng_state, n, 1.0), test_lcg_floats(&rng_state, n, 0.01),
               test_lcg_floats(&rng_state, n, 0.001), test_lcg_floats(&rng_state, n, 1e-6)};
    for (size_t i = 0; i < n; i++) s.v[i] = fabsf(s.v[i]); /* a second moment is >= 0 */
    return s;
}

static state state_copy(const state *a, size_t n) {
    size_t b = n * sizeof(float) + 1;
    state s = {malloc(b), malloc(b), malloc(b), malloc(b)};
    if (!s.p || !s.g || !s.m || !s.v) abort();
    memcpy(s.p, a->p, b - 1);
    memcpy(s.g, a->g, b - 1);
    memcpy(s.m, a->m, b - 1);
    memcpy(s.v, a->v, b - 1);
    return s;
}

static void state_free(state *s) {
    free(s->p);
    free(s->g);
    free(s->m);
    free(s->v);
}

static bool same_bits(const state *a, const state *b, size_t n) {
    size_t bytes = n * sizeof(float);
    return memcmp(a->p, b->p, bytes) == 0 && memcmp(a->m, b->m, bytes) == 0 &&
           memcmp(a->v, b->v, bytes) == 0;
}

static const float LR = 3e-3f, B1 = 0.9f, B2 = 0.999f, EPS = 1e-8f;

static void test_paths(void) {
    const size_t sizes[] = {0, 1, 15, 16, 17, 1000003};
    const int threads[] = {1, 2, 3, 7};
    const long steps[] = {1, 1000};
    const float decays[] = {0.0f, 0.1f};
    int paths = 0;
    for (int isa = 0; isa < MT_ADAMW_ISA_COUNT; isa++) {
        if (!mt_adamw_isa_supported((mt_adamw_isa)isa)) {
            printf("path %s: not on this CPU, skipped\n", mt_adamw_isa_name((mt_adamw_isa)isa));
            continue;
        }
        paths++;
        for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
            mt_thread_pool *pool = NULL;
            CHECK_OK(mt_thread_pool_create(threads[ti], &pool));
            for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
                size_t n = sizes[si];
                state init = state_new(n);
                for (size_t k = 0; k < 2; k++)
                    for (size_t d = 0; d < 2; d++) {
                        state want = state_copy(&init, n), got = state_copy(&init, n);
                        reference(want.p, want.g, want.m, want.v, n, steps[k], LR, B1, B2, EPS,
                                  decays[d]);
                        CHECK_OK(mt_host_adamw(pool, (mt_adamw_isa)isa, got.p, got.g, got.m,
                                               got.v, n, steps[k], LR, B1, B2, EPS, decays[d]));
                        CHECK_MSG(same_bits(&want, &got, n),
                                  "%s, %d thread(s), n %zu, step %ld, decay %g: bits differ",
                                  mt_adamw_isa_name((mt_adamw_isa)isa), threads[ti], n,
                                  steps[k], (double)decays[d]);
                        state_free(&want);
                        state_free(&got);
                    }
                /* Three chained steps: the moments written by one feed the next. */
                state want = state_copy(&init, n), got = state_copy(&init, n);
                for (long t = 1; t <= 3; t++) {
                    reference(want.p, want.g, want.m, want.v, n, t, LR, B1, B2, EPS, 0.01f);
                    CHECK_OK(mt_host_adamw(pool, (mt_adamw_isa)isa, got.p, got.g, got.m, got.v,
                                           n, t, LR, B1, B2, EPS, 0.01f));
                }
                CHECK_MSG(same_bits(&want, &got, n), "%s, %d thread(s), n %zu: 3 steps differ",
                          mt_adamw_isa_name((mt_adamw_isa)isa), threads[ti], n);
                state_free(&want);
                state_free(&got);
                /* A clipping factor applied as the step reads the gradient. */
                const float clip = 0.3183099f;
                want = state_copy(&init, n), got = state_copy(&init, n);
                for (size_t i = 0; i < n; i++) want.g[i] = want.g[i] * clip;
                reference(want.p, want.g, want.m, want.v, n, 2, LR, B1, B2, EPS, 0.01f);
                CHECK_OK(mt_host_adamw_scaled(pool, (mt_adamw_isa)isa, got.p, got.g, clip, got.m,
                                              got.v, n, 2, LR, B1, B2, EPS, 0.01f));
                CHECK_MSG(same_bits(&want, &got, n) &&
                              (n == 0 || memcmp(got.g, init.g, n * sizeof(float)) == 0),
                          "%s, %d thread(s), n %zu: the scaled step differs from scaling first, "
                          "or wrote the gradient", mt_adamw_isa_name((mt_adamw_isa)isa),
                          threads[ti], n);
                state_free(&want);
                state_free(&got);
                state_free(&init);
            }
            mt_thread_pool_destroy(pool);
        }
    }
    CHECK(paths >= 1);
}

/* The reference must be worth something: a different result is caught. */
static void test_reference_sensitive(void) {
    size_t n = 33;
    state init = state_new(n);
    state a = state_copy(&init, n), b = state_copy(&init, n);
    reference(a.p, a.g, a.m, a.v, n, 1, LR, B1, B2, EPS, 0.0f);
    CHECK_OK(mt_host_adamw(NULL, MT_ADAMW_SCALAR, b.p, b.g, b.m, b.v, n, 2, LR, B1, B2, EPS, 0.0f));
    CHECK(!same_bits(&a, &b, n));
    state_free(&a);
    state_free(&b);
    state_free(&init);
}

/* The device op is the host AdamW: under each MT_ADAMW_ISA it gives the reference's bits. */
static void test_device_op(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return;
    size_t n = 70001;
    state init = state_new(n);
    for (int isa = 0; isa < MT_ADAMW_ISA_COUNT; isa++) {
        if (!mt_adamw_isa_supported((mt_adamw_isa)isa)) continue;
        setenv("MT_ADAMW_ISA", mt_adamw_isa_name((mt_adamw_isa)isa), 1);
        state want = state_copy(&init, n), got = state_copy(&init, n);
        reference(want.p, want.g, want.m, want.v, n, 7, LR, B1, B2, EPS, 0.05f);
        CHECK_OK(mt_op_adamw(dev, got.p, got.g, got.m, got.v, n, 7, LR, B1, B2, EPS, 0.05f));
        CHECK_MSG(same_bits(&want, &got, n), "mt_op_adamw with MT_ADAMW_ISA=%s",
                  mt_adamw_isa_name((mt_adamw_isa)isa));
        state_free(&want);
        state_free(&got);
    }
    /* An unknown path is refused by name, and so is one this CPU lacks. */
    setenv("MT_ADAMW_ISA", "sse9", 1);
    state s = state_copy(&init, n);
    CHECK(mt_op_adamw(dev, s.p, s.g, s.m, s.v, n, 1, LR, B1, B2, EPS, 0.0f) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "MT_ADAMW_ISA='sse9'") != NULL);
    CHECK(memcmp(s.p, init.p, n * sizeof(float)) == 0);
    for (int isa = 0; isa < MT_ADAMW_ISA_COUNT; isa++) {
        if (mt_adamw_isa_supported((mt_adamw_isa)isa)) continue;
        setenv("MT_ADAMW_ISA", mt_adamw_isa_name((mt_adamw_isa)isa), 1);
        CHECK(mt_op_adamw(dev, s.p, s.g, s.m, s.v, n, 1, LR, B1, B2, EPS, 0.0f) ==
              MT_ERR_UNSUPPORTED);
        CHECK(strstr(mt_last_error(), "this CPU has no") != NULL);
        CHECK(mt_host_adamw(NULL, (mt_adamw_isa)isa, s.p, s.g, s.m, s.v, n, 1, LR, B1, B2, EPS,
                            0.0f) == MT_ERR_UNSUPPORTED);
    }
    unsetenv("MT_ADAMW_ISA");
    mt_adamw_isa best = MT_ADAMW_ISA_COUNT;
    CHECK_OK(mt_adamw_isa_select(&best));
    CHECK(best < MT_ADAMW_ISA_COUNT && mt_adamw_isa_supported(best));
    printf("best path on this CPU: %s\n", mt_adamw_isa_name(best));
    state_free(&s);
    state_free(&init);
    mt_device_close(dev);
}

int main(void) {
    test_reference_sensitive();
    test_paths();
    test_device_op();
    return check_report("test_host_adamw");
}
