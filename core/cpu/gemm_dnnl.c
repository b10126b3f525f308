/* bf16 and f32 products on oneDNN's matmul primitive (core/cpu/gemm_dnnl.h).
 *
 * Threads: the rank's pool runs the blocks of C (cut by core/cpu/gemm_split.h from the shape
 * alone, as the f32 products are), and each block is one oneDNN call on the calling thread with
 * ONE oneDNN thread. Debian's oneDNN runs its parallel regions on OpenMP, sized by the calling
 * thread's OpenMP thread count (the cores by default): every pool thread would start its own
 * team beside the pool, oversubscribing the cores, and a product's split over a team would
 * change its bits with the team's size. So the calling thread's count is set to 1 around the
 * primitive's creation (oneDNN fixes the primitive's partition then) and execution, and given
 * back after, leaving the caller's own OpenMP use as it was.
 *
 * Primitives: creating one costs a millisecond or more, so they are made once per (block shape,
 * transposes, leading dimensions, operand type, alpha, beta) and kept for the process in a small
 * table under a lock; steady state creates none. A primitive may run on several threads at once
 * when each brings its own scratchpad (oneDNN's user scratchpad mode) and stream: both are per
 * thread here, kept in thread-specific storage and freed when the thread exits. The memory objects
 * that wrap the caller's pointers are made per call (they allocate nothing of the data's size).
 *
 * beta is a sum post-op (dst = beta dst + alpha A B), alpha an output scale; without beta the
 * primitive overwrites C, as BLAS does. Transposes are strides of the memory descriptors. The
 * floating-point mode is set strict on every primitive, so that a default that a user's
 * ONEDNN_DEFAULT_FPMATH_MODE names (bf16, say) never rounds the f32 products' operands down. */
#include "core/cpu/gemm_dnnl.h"

#include "core/cpu/gemm_split.h"
#include "core/cpu/parallel.h"
#include "core/error.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <oneapi/dnnl/dnnl_version.h>

#if DNNL_VERSION_MAJOR != 2
#error "core/cpu/gemm_dnnl.c uses oneDNN 2.x's C API (matmul descriptors, output scales), which \
oneDNN 3 removed: build against oneDNN 2 (Debian 12's libdnnl-dev 2.6)"
#endif

#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#elif DNNL_CPU_THREADING_RUNTIME != DNNL_RUNTIME_SEQ
#error "meshtrain runs oneDNN on its pool's threads, one oneDNN thread each: it handles oneDNN \
builds on OpenMP or sequential, not this one's threading runtime"
#endif

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* A block is at least this many multiply-adds: oneDNN's bf16 kernels run some 3 times faster than
 * sgemm on AVX512-BF16 (docs/benchmarks.md, "bf16 products"), so a block worth a hand-off is
 * larger than an sgemm block. */
#define MT_DNNL_MIN_BLOCK_MACS ((double)(1 << 24))
/* Primitives kept: a GPT needs some 30 (its products' block shapes); a program that makes more
 * shapes than this gets the rest created, run and destroyed per call, correct but slow. */
#define MT_DNNL_CACHE_MAX 512

/* What makes a primitive: compared with memcmp, so every instance is zeroed first. */
typedef struct prim_key {
    int m, n, k, lda, ldb, ldc;
    int ta, tb;
    int ab_type; /* dnnl_data_type_t of A and B (bf16 or f32); C is f32 */
    float alpha, beta;
} prim_key;
/* No padding, whose bytes a struct copy need not keep. */
_Static_assert(sizeof(prim_key) == 9 * sizeof(int) + 2 * sizeof(float), "prim_key is padded");

typedef struct prim_entry {
    prim_key key;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a_md, b_md, c_md, scratch_md;
    size_t scratch_bytes;
} prim_entry;

/* The process's engine and primitive table. */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static dnnl_status_t g_init_status = dnnl_success;
static const char *g_init_what = "";
static dnnl_engine_t g_engine;
static pthread_key_t g_thread_key;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static prim_entry *g_entries[MT_DNNL_CACHE_MAX];
static size_t g_count;

/* One thread's stream and scratchpad. */
typedef struct thread_state {
    dnnl_stream_t stream;
    void *scratch;
    size_t scratch_cap;
} thread_state;

static void thread_state_free(void *p) {
    thread_state *ts = p;
    if (ts->stream) dnnl_stream_destroy(ts->stream);
    free(ts->scratch);
    free(ts);
}

static void init_once(void) {
    if (pthread_key_create(&g_thread_key, thread_state_free) != 0) {
        g_init_status = dnnl_out_of_memory;
        g_init_what = "creating the per-thread key";
        return;
    }
    g_init_status = dnnl_engine_create(&g_engine, dnnl_cpu, 0);
    g_init_what = "creating the CPU engine";
}

/* OpenMP runtime: the calling thread's thread count set to 1; returns the previous count. */
static int one_thread_begin(void) {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    int prev = omp_get_max_threads();
    if (prev != 1) omp_set_num_threads(1);
    return prev;
#else
    return 1;
#endif
}

static void one_thread_end(int prev) {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    if (prev != 1) omp_set_num_threads(prev);
#else
    (void)prev;
#endif
}

/* A failed oneDNN call: its status and what it was. */
typedef struct dnnl_fail {
    dnnl_status_t status;
    const char *what;
} dnnl_fail;

#define DNNL_TRY(call, label)                                                                    \
    do {                                                                                         \
        dnnl_status_t s_ = (call);                                                               \
        if (s_ != dnnl_success) {                                                                \
            *fail = (dnnl_fail){s_, label};                                                      \
            goto out;                                                                            \
        }                                                                                        \
    } while (0)

/* The primitive of key (one thread). */
static prim_entry *entry_create(const prim_key *key, dnnl_fail *fail) {
    prim_entry *e = calloc(1, sizeof *e);
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post = NULL;
    dnnl_primitive_desc_t pd = NULL;
    if (!e) {
        *fail = (dnnl_fail){dnnl_out_of_memory, "allocating a primitive's entry"};
        return NULL;
    }
    e->key = *key;
    /* op(A) is m x k: A's element (i, p) sits at i lda + p, or at p lda + i when transposed. */
    dnnl_dims_t a_dims = {key->m, key->k}, b_dims = {key->k, key->n}, c_dims = {key->m, key->n};
    dnnl_dims_t a_str = {key->ta ? 1 : key->lda, key->ta ? key->lda : 1};
    dnnl_dims_t b_str = {key->tb ? 1 : key->ldb, key->tb ? key->ldb : 1};
    dnnl_dims_t c_str = {key->ldc, 1};
    dnnl_matmul_desc_t desc;
    dnnl_data_type_t ab = (dnnl_data_type_t)key->ab_type;
    DNNL_TRY(dnnl_memory_desc_init_by_strides(&e->a_md, 2, a_dims, ab, a_str), "A's layout");
    DNNL_TRY(dnnl_memory_desc_init_by_strides(&e->b_md, 2, b_dims, ab, b_str), "B's layout");
    DNNL_TRY(dnnl_memory_desc_init_by_strides(&e->c_md, 2, c_dims, dnnl_f32, c_str), "C's layout");
    DNNL_TRY(dnnl_matmul_desc_init(&desc, &e->a_md, &e->b_md, NULL, &e->c_md), "the matmul");
    DNNL_TRY(dnnl_primitive_attr_create(&attr), "the attributes");
    DNNL_TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user),
             "the user scratchpad mode");
    DNNL_TRY(dnnl_primitive_attr_set_fpmath_mode(attr, dnnl_fpmath_mode_strict),
             "the strict floating-point mode");
    if (key->alpha != 1.0f)
        DNNL_TRY(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &key->alpha), "alpha");
    if (key->beta != 0.0f) {
        DNNL_TRY(dnnl_post_ops_create(&post), "the post-ops");
        DNNL_TRY(dnnl_post_ops_append_sum(post, key->beta), "beta's sum post-op");
        DNNL_TRY(dnnl_primitive_attr_set_post_ops(attr, post), "the post-ops");
    }
    DNNL_TRY(dnnl_primitive_desc_create(&pd, &desc, attr, g_engine, NULL),
             "the primitive descriptor");
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (smd) e->scratch_md = *smd;
    e->scratch_bytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    DNNL_TRY(dnnl_primitive_create(&e->prim, pd), "the primitive");
out:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (post) dnnl_post_ops_destroy(post);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (fail->status != dnnl_success) {
        free(e);
        return NULL;
    }
    return e;
}

static void entry_destroy(prim_entry *e) {
    if (!e) return;
    dnnl_primitive_destroy(e->prim);
    free(e);
}

/* The kept primitive of key, made now if new; *owned when it could not be kept (the caller
 * destroys it after running it). */
static prim_entry *entry_get(const prim_key *key, bool *owned, dnnl_fail *fail) {
    *owned = false;
    pthread_mutex_lock(&g_lock);
    prim_entry *e = NULL;
    for (size_t i = 0; i < g_count && !e; i++)
        if (memcmp(&g_entries[i]->key, key, sizeof *key) == 0) e = g_entries[i];
    if (!e) {
        /* Made under the lock: a thread wanting the same primitive waits rather than makes a
         * second; different shapes are made once each, so the wait is a first-step cost. */
        e = entry_create(key, fail);
        if (e && g_count < MT_DNNL_CACHE_MAX) g_entries[g_count++] = e;
        else if (e) *owned = true;
    }
    pthread_mutex_unlock(&g_lock);
    return e;
}

static thread_state *thread_state_get(dnnl_fail *fail) {
    thread_state *ts = pthread_getspecific(g_thread_key);
    if (ts) return ts;
    ts = calloc(1, sizeof *ts);
    if (!ts) {
        *fail = (dnnl_fail){dnnl_out_of_memory, "the thread's state"};
        return NULL;
    }
    dnnl_status_t s = dnnl_stream_create(&ts->stream, g_engine, dnnl_stream_default_flags);
    if (s != dnnl_success) {
        free(ts);
        *fail = (dnnl_fail){s, "the thread's stream"};
        return NULL;
    }
    if (pthread_setspecific(g_thread_key, ts) != 0) {
        thread_state_free(ts);
        *fail = (dnnl_fail){dnnl_out_of_memory, "the thread's state"};
        return NULL;
    }
    return ts;
}

/* One block: C (key's m x n at c) = alpha op(A) op(B) + beta C, on this thread. */
static void run_block(const prim_key *key, const void *a, const void *b, float *c,
                      dnnl_fail *fail) {
    int prev = one_thread_begin();
    bool owned = false;
    dnnl_memory_t mem[4] = {NULL, NULL, NULL, NULL};
    thread_state *ts = thread_state_get(fail);
    prim_entry *e = ts ? entry_get(key, &owned, fail) : NULL;
    if (!e) goto out;
    if (e->scratch_bytes > ts->scratch_cap) {
        void *grown = realloc(ts->scratch, e->scratch_bytes);
        if (!grown) {
            *fail = (dnnl_fail){dnnl_out_of_memory, "the scratchpad"};
            goto out;
        }
        ts->scratch = grown;
        ts->scratch_cap = e->scratch_bytes;
    }
    /* oneDNN's memory objects take non-const handles; it only reads A and B. */
    DNNL_TRY(dnnl_memory_create(&mem[0], &e->a_md, g_engine, (void *)(uintptr_t)a), "A's memory");
    DNNL_TRY(dnnl_memory_create(&mem[1], &e->b_md, g_engine, (void *)(uintptr_t)b), "B's memory");
    DNNL_TRY(dnnl_memory_create(&mem[2], &e->c_md, g_engine, c), "C's memory");
    /* A primitive that needs no scratchpad gets none. */
    if (e->scratch_bytes)
        DNNL_TRY(dnnl_memory_create(&mem[3], &e->scratch_md, g_engine, ts->scratch),
                 "the scratchpad's memory");
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem[0]},
                               {DNNL_ARG_WEIGHTS, mem[1]},
                               {DNNL_ARG_DST, mem[2]},
                               {DNNL_ARG_SCRATCHPAD, mem[3]}};
    DNNL_TRY(dnnl_primitive_execute(e->prim, ts->stream, e->scratch_bytes ? 4 : 3, args),
             "executing the matmul");
    DNNL_TRY(dnnl_stream_wait(ts->stream), "waiting for the matmul");
out:
    for (int i = 0; i < 4; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    if (owned) entry_destroy(e);
    one_thread_end(prev);
}

typedef struct dnnl_job {
    prim_key full; /* the whole product's key; blocks change m or n */
    const char *a, *b; /* bytes: elem_size per element */
    size_t elem_size;
    float *c;
    mt_gemm_split split;
    dnnl_fail fails[MT_CPU_GEMM_MAX_BLOCKS]; /* per block (chunk index): no two threads share */
} dnnl_job;

/* Block `chunk` of C (core/cpu/gemm_split.h): its rows of op(A) against its columns of op(B). */
static void dnnl_block(void *ctx, size_t chunk, size_t begin, size_t end) {
    dnnl_job *j = ctx;
    size_t r0, r1, c0, c1;
    mt_cpu_gemm_block(&j->split, j->full.m, j->full.n, chunk, &r0, &r1, &c0, &c1);
    prim_key key = j->full;
    key.m = (int)(r1 - r0), key.n = (int)(c1 - c0);
    size_t es = j->elem_size;
    const char *a = j->full.ta ? j->a + r0 * es : j->a + r0 * (size_t)j->full.lda * es;
    const char *b = j->full.tb ? j->b + c0 * (size_t)j->full.ldb * es : j->b + c0 * es;
    run_block(&key, a, b, j->c + r0 * (size_t)j->full.ldc + c0, &j->fails[chunk]);
}

/* C = alpha op(A) op(B) + beta C with A and B of oneDNN type ab (elem_size bytes each). */
static mt_status dnnl_matmul_blocks(const char *op, const char *type_name, dnnl_data_type_t ab,
                                    size_t elem_size, bool trans_a, bool trans_b, int m, int n,
                                    int k, float alpha, const void *a, const void *b, float beta,
                                    float *c, double min_block_macs) {
    pthread_once(&g_once, init_once);
    if (g_init_status != dnnl_success)
        return mt_error(MT_ERR_UNSUPPORTED, "%s (%s, oneDNN): %s failed: %s", op, type_name,
                        g_init_what, dnnl_status2str(g_init_status));
    dnnl_job *job = calloc(1, sizeof *job);
    if (!job)
        return mt_error(MT_ERR_OUT_OF_MEMORY, "%s (%s, oneDNN): no memory for the job", op,
                        type_name);
    memset(&job->full, 0, sizeof job->full);
    job->full.m = m, job->full.n = n, job->full.k = k;
    job->full.lda = trans_a ? m : k, job->full.ldb = trans_b ? k : n, job->full.ldc = n;
    job->full.ta = trans_a, job->full.tb = trans_b;
    job->full.ab_type = (int)ab;
    job->full.alpha = alpha, job->full.beta = beta;
    job->a = a, job->b = b, job->elem_size = elem_size, job->c = c;
    job->split = mt_cpu_gemm_split(m, n, k, min_block_macs);
    size_t blocks = job->split.row_blocks * job->split.col_blocks;
    mt_status st = MT_OK;
    if (blocks == 1) dnnl_block(job, 0, 0, 1);
    else st = mt_cpu_parallel(op, blocks, 1, dnnl_block, job);
    for (size_t i = 0; st == MT_OK && i < MT_CPU_GEMM_MAX_BLOCKS; i++) {
        const dnnl_fail *f = &job->fails[i];
        if (f->status == dnnl_success) continue;
        mt_status code = f->status == dnnl_out_of_memory ? MT_ERR_OUT_OF_MEMORY
                         : f->status == dnnl_unimplemented ? MT_ERR_UNSUPPORTED
                                                           : MT_ERR_INTERNAL;
        st = mt_error(code,
                      "%s (%s, oneDNN): %s for the %dx%dx%d product (%s%s, block %zu) failed: "
                      "%s",
                      op, type_name, f->what, m, n, k, trans_a ? "A^T" : "A",
                      trans_b ? " B^T" : " B", i, dnnl_status2str(f->status));
    }
    free(job);
    return st;
}

mt_status mt_cpu_dnnl_gemm_bf16(const char *op, bool trans_a, bool trans_b, int m, int n, int k,
                                float alpha, const uint16_t *a, const uint16_t *b, float beta,
                                float *c) {
    return dnnl_matmul_blocks(op, "bf16", dnnl_bf16, sizeof *a, trans_a, trans_b, m, n, k, alpha,
                              a, b, beta, c, MT_DNNL_MIN_BLOCK_MACS);
}

mt_status mt_cpu_dnnl_gemm_f32(const char *op, bool trans_a, bool trans_b, int m, int n, int k,
                               float alpha, const float *a, const float *b, float beta, float *c,
                               double min_block_macs) {
    return dnnl_matmul_blocks(op, "f32", dnnl_f32, sizeof *a, trans_a, trans_b, m, n, k, alpha, a,
                              b, beta, c, min_block_macs);
}

size_t mt_cpu_dnnl_primitives(void) {
    pthread_mutex_lock(&g_lock);
    size_t n = g_count;
    pthread_mutex_unlock(&g_lock);
    return n;
}

bool mt_cpu_dnnl_native_bf16(void) {
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    return isa == dnnl_cpu_isa_avx512_core_bf16 || isa == dnnl_cpu_isa_avx512_core_amx;
}

bool mt_cpu_dnnl_avx512(void) {
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core:
    case dnnl_cpu_isa_avx512_core_vnni:
    case dnnl_cpu_isa_avx512_core_bf16:
    case dnnl_cpu_isa_avx512_core_amx: return true;
    default: return false;
    }
}

bool mt_cpu_dnnl_amx(void) {
    return dnnl_get_effective_cpu_isa() == dnnl_cpu_isa_avx512_core_amx;
}

const char *mt_cpu_dnnl_isa_name(void) {
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    default: return "a pre-AVX2 ISA";
    }
}
