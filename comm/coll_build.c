/* The host backend's algorithms, written as task lists for the schedule engine (coll_schedule.c,
 * comm/schedule.h).
 *
 * Large messages use rings pipelined in chunks (tr->chunk_bytes, tr->window chunks in flight):
 * all_gather receives straight into the output; reduce_scatter receives a chunk into scratch and
 * reduces it with the local contribution into the chunk it sends next (or into the output on the
 * last step); all_reduce is reduce_scatter over uneven blocks followed by an all_gather ring in
 * the output; broadcast is a pipelined chain from the root. Below tr->small_bytes every rank
 * exchanges directly with every other (one round, latency-bound sizes) and reduces the inputs in
 * group-rank order, so every member computes identical bits. barrier is a dissemination barrier
 * of empty messages.
 */
#include "comm/coll_scratch.h"
#include "comm/group.h"
#include "comm/host/ucx.h"
#include "comm/schedule.h"
#include "comm/work.h"

#include "core/cpu/sum_squares.h"
#include "core/error.h"
#include "core/host_alloc.h"

#include <stdlib.h>
#include <string.h>

typedef struct ring {
    int n, r, left, right;
    size_t esize, chunk; /* element size, elements per chunk */
} ring;

static int mod(int a, int n) { return ((a % n) + n) % n; }

static void ring_init(ring *g, mt_work *w) {
    g->n = w->group->size;
    g->r = w->group->rank;
    g->left = mod(g->r - 1, g->n);
    g->right = mod(g->r + 1, g->n);
    g->esize = mt_dtype_size(w->dtype);
    g->chunk = w->tr->chunk_bytes / g->esize;
    if (g->chunk == 0) g->chunk = 1;
}

/* Blocks of an uneven split: block i covers [off(i), off(i+1)). */
static size_t block_off(size_t count, int n, int i) {
    return (size_t)((unsigned __int128)count * (unsigned)i / (unsigned)n);
}

static size_t chunks_of(size_t len, size_t chunk) { return (len + chunk - 1) / chunk; }

static uint32_t sub_of(size_t step, size_t nchunks, size_t k) {
    return (uint32_t)((step * nchunks + k) & MT_TAG_SUB_MASK);
}

/* Scratch belongs to the group and is reused: collectives of a group run one at a time, and fresh
 * pages would cost a page fault each on every operation. It comes from the rank's CPU device
 * (category comm), whose large blocks local peers read directly (comm/host/shm.c); with another
 * device kind, from host memory. */
static void *scratch(mt_work *w, size_t bytes) {
    mt_group *g = w->group;
    if (g->scratch_bytes < bytes || !g->scratch) {
        mt_group_free_scratch(g);
        mt_device *dev = mt_runtime_device(g->rt);
        if (dev && mt_device_get_kind(dev) == MT_DEVICE_CPU) {
            if (mt_device_alloc(dev, bytes, MT_MEM_COMM, &g->scratch) != MT_OK) g->scratch = NULL;
            g->scratch_device = g->scratch ? dev : NULL;
        } else {
            g->scratch = mt_host_alloc(bytes, 64);
            if (!g->scratch) mt_error(MT_ERR_OUT_OF_MEMORY, "the host refused %zu bytes", bytes);
        }
        g->scratch_bytes = g->scratch ? bytes : 0;
    }
    return g->scratch;
}

void mt_group_free_scratch(mt_group *g) {
    if (g->scratch_device) mt_device_free(g->scratch_device, g->scratch);
    else free(g->scratch);
    g->scratch = NULL;
    g->scratch_device = NULL;
    g->scratch_bytes = 0;
}

/* ---- all_gather ----------------------------------------------------------------------------- */

static mt_status build_all_gather(mt_work *w) {
    ring g;
    ring_init(&g, w);
    size_t bytes = w->count * g.esize;
    char *out = w->recv;
    const char *in = w->send;
    mt_sched s;
    if (w->count == 0) {
        mt_sched_init(&s, w, 1);
        return mt_sched_finish(&s);
    }
    bool small = bytes * (size_t)g.n <= w->tr->small_bytes;
    size_t nch = small ? 1 : chunks_of(w->count, g.chunk);
    mt_sched_init(&s, w, 1 + 2 * (g.n - 1) * (int)nch);
    mt_sched_copy(&s, out + (size_t)g.r * bytes, in, bytes, false);
    if (small) {
        w->window = g.n;
        for (int i = 1; i < g.n; i++) {
            mt_sched_send(&s, mod(g.r + i, g.n), 0, in, bytes, -1, -1);
            int from = mod(g.r - i, g.n);
            mt_sched_recv(&s, from, 0, out + (size_t)from * bytes, bytes, -1, -1);
        }
        return mt_sched_finish(&s);
    }
    int *prev_recv = malloc(nch * sizeof *prev_recv);
    if (!prev_recv) return mt_error(MT_ERR_OUT_OF_MEMORY, "all_gather: schedule");
    for (int st = 0; st < g.n - 1; st++) {
        int send_block = mod(g.r - st, g.n), recv_block = mod(g.r - st - 1, g.n);
        for (size_t k = 0; k < nch; k++) {
            size_t off = k * g.chunk * g.esize;
            size_t len = (k + 1 == nch ? w->count - k * g.chunk : g.chunk) * g.esize;
            const char *src = st == 0 ? in + off : out + (size_t)send_block * bytes + off;
            int dep = st == 0 ? -1 : prev_recv[k];
            mt_sched_send(&s, g.right, sub_of((size_t)st, nch, k), src, len, dep, -1);
            prev_recv[k] = mt_sched_recv(&s, g.left, sub_of((size_t)st, nch, k),
                                         out + (size_t)recv_block * bytes + off, len, -1, -1);
        }
    }
    free(prev_recv);
    return mt_sched_finish(&s);
}

/* ---- reduce_scatter and the first half of all_reduce ---------------------------------------- */

/* Ring reduce-scatter over blocks [off(i), off(i+1)) of `in` (elements), leaving the reduced
 * block r in out_block. bufA receives a chunk, bufB holds the partial sum sent on the next step;
 * both hold one block. squares: the last step's reductions take the work's sums of squares. */
static void ring_reduce_scatter(mt_sched *s, mt_work *w, ring *g, const char *in,
                                size_t (*off)(const mt_work *, int), char *out_block,
                                char *bufA, char *bufB, size_t nch, bool squares) {
    int *red = malloc(nch * sizeof *red);
    if (!red) {
        s->oom = true;
        return;
    }
    for (int st = 0; st < g->n - 1; st++) {
        bool last = st == g->n - 2;
        int send_block = mod(g->r - st - 1, g->n), recv_block = mod(g->r - st - 2, g->n);
        size_t sb0 = off(w, send_block), sblen = off(w, send_block + 1) - sb0;
        size_t rb0 = off(w, recv_block), rblen = off(w, recv_block + 1) - rb0;
        for (size_t k = 0; k < nch; k++) {
            size_t c0 = k * g->chunk;
            uint32_t sub = sub_of((size_t)st, nch, k);
            int send_i = -1;
            if (c0 < sblen) {
                size_t len = (sblen - c0 < g->chunk ? sblen - c0 : g->chunk) * g->esize;
                const char *src = st == 0 ? in + (sb0 + c0) * g->esize : bufB + c0 * g->esize;
                send_i = mt_sched_send(s, g->right, sub, src, len, st == 0 ? -1 : red[k], -1);
            }
            int prev_red = st == 0 ? -1 : red[k];
            red[k] = -1;
            if (c0 < rblen) {
                size_t n = rblen - c0 < g->chunk ? rblen - c0 : g->chunk;
                int recv_i = mt_sched_recv(s, g->left, sub, bufA + c0 * g->esize, n * g->esize,
                                           prev_red, -1);
                char *dst = last ? out_block + c0 * g->esize : bufB + c0 * g->esize;
                /* bufB's chunk is rewritten only after this step's send of it completed. */
                red[k] = mt_sched_reduce(s, last, dst, in + (rb0 + c0) * g->esize,
                                         bufA + c0 * g->esize, n, recv_i, last ? -1 : send_i,
                                         prev_red);
                if (last && squares) mt_sched_squares(s, red[k], c0);
            }
        }
    }
    free(red);
}

static size_t rs_off(const mt_work *w, int i) { return (size_t)i * w->count; }
static size_t ar_off(const mt_work *w, int i) { return block_off(w->count, w->group->size, i); }

/* Whether the final reductions of a reduce-scatter's output, `chunk` elements each (nch of them,
 * from element 0), can take the sums of squares its caller asked for (comm/coll_squares.h) as
 * they write it: each must start on a chunk of the sums (MT_SQ_CHUNK). Where they cannot,
 * finish_rs adds a pass over the output for them. */
static bool squares_inline(const mt_work *w, size_t chunk, size_t nch) {
    return w->squares.partial && (nch <= 1 || chunk % MT_SQ_CHUNK == 0);
}

/* Ends a reduce-scatter's schedule: sums of squares asked for and not taken by the reductions
 * (taken false) come from one more task that reads the output once every other task is done. */
static mt_status finish_rs(mt_sched *s, bool taken) {
    if (s->w->squares.partial && !taken) mt_sched_squares_pass(s);
    return mt_sched_finish(s);
}

static mt_status build_direct_reduce(mt_work *w, ring *g, size_t block_count, bool scatter) {
    /* Every member's block (scatter) or whole buffer goes to every other member. */
    size_t bytes = block_count * g->esize;
    /* The input pointers first (aligned by malloc), then one slot per member. */
    size_t table = mt_comm_scratch_direct_table(g->n);
    char *base = scratch(w, table + (size_t)g->n * bytes);
    if (!base) return mt_error_wrap(MT_ERR_OUT_OF_MEMORY, "%s: %zu bytes of scratch",
                                    mt_op_name(w->kind), (size_t)g->n * bytes);
    const void **inputs = (const void **)base;
    char *buf = base + table;
    const char *in = w->send;
    mt_sched s;
    mt_sched_init(&s, w, 2 * g->n + 1);
    w->window = g->n;
    for (int i = 1; i < g->n; i++) {
        int to = mod(g->r + i, g->n), from = mod(g->r - i, g->n);
        mt_sched_send(&s, to, 0, scatter ? in + (size_t)to * bytes : in, bytes, -1, -1);
        mt_sched_recv(&s, from, 0, buf + (size_t)from * bytes, bytes, -1, -1);
    }
    for (int j = 0; j < g->n; j++)
        inputs[j] = j == g->r ? (const void *)(scatter ? in + (size_t)j * bytes : in)
                              : (const void *)(buf + (size_t)j * bytes);
    int reduce = mt_sched_reduce_many(&s, w->recv, (const void *const *)inputs, g->n,
                                      block_count);
    if (!scatter) return mt_sched_finish(&s);
    mt_sched_squares(&s, reduce, 0);
    return finish_rs(&s, true);
}

static mt_status build_single(mt_work *w, size_t bytes) {
    mt_sched s;
    mt_sched_init(&s, w, 2);
    if (bytes) mt_sched_copy(&s, w->recv, w->send, bytes, false);
    return w->kind == MT_OP_REDUCE_SCATTER ? finish_rs(&s, false) : mt_sched_finish(&s);
}

/* Whether a large reduce-scatter of w goes through build_local_reduce_scatter: 3 or more
 * members (at 2 the ring is already one pass), all on this host with the shared-memory path on
 * (every member decides alike: the hosts are known to all, and the path is on or off for a whole
 * host, comm/host/shm.c), and a scratch slot of at least one element. */
static bool local_direct_rs(mt_work *w, const ring *g) {
    if (!w->tr->local_direct_rs || !w->tr->shm.enabled || g->n < 3 ||
        g->n > MT_REDUCE_PEERS_MAX || 2 * w->count < (size_t)(g->n - 1))
        return false;
    for (int i = 0; i < g->n; i++)
        if (!w->tr->shm.same_host[mt_group_global_rank(w->group, i)]) return false;
    return true;
}

/* Reduce-scatter among members of one host that read each other's shared memory: every member
 * sends each other member that member's block as descriptors (comm/host/shm.c), chunk by chunk,
 * and sums its own block from all n inputs in group-rank order where they lie, one pass. The
 * ring instead makes n - 1 passes, each reading two blocks and writing one, so this moves about
 * (n + 1) / (3 (n - 1)) of the ring's bytes (4 ranks: 0.56; docs/benchmarks.md). A peer whose
 * bytes come as data (its buffer is not in a shared block) lands in a scratch slot; the slots
 * stay within the ring's scratch (2 blocks, mt_comm_scratch_reduce_scatter), reused every
 * `slots` chunks once the chunk that used them was reduced. */
static mt_status build_local_reduce_scatter(mt_work *w, ring *g) {
    size_t esize = g->esize, count = w->count;
    size_t peers = (size_t)g->n - 1;
    /* Chunks small enough for two slots per member, so that a chunk is received while the one
     * before it is summed (one slot would serialise them); one slot only when a block has fewer
     * elements than members. */
    size_t chunk = g->chunk, half = count / peers, room = 2 * count / peers;
    if (half >= 1 && chunk > half) chunk = half;
    if (chunk > room) chunk = room;
    /* Whole chunks of the sums of squares, so that the reductions can take them
     * (squares_inline); every member cuts alike, asked for them or not. */
    if (chunk > MT_SQ_CHUNK) chunk -= chunk % MT_SQ_CHUNK;
    size_t nch = chunks_of(count, chunk);
    bool squares = squares_inline(w, chunk, nch);
    size_t slots = 2 * count / (peers * chunk);
    if (slots > (size_t)w->tr->window) slots = (size_t)w->tr->window;
    if (slots > nch) slots = nch;
    char *buf = scratch(w, 2 * count * esize);
    if (!buf) return mt_error_wrap(MT_ERR_OUT_OF_MEMORY, "reduce_scatter: %zu bytes of scratch",
                                   2 * count * esize);
    int *reduced = malloc(slots * sizeof *reduced);
    if (!reduced) return mt_error(MT_ERR_OUT_OF_MEMORY, "reduce_scatter: schedule");
    const char *in = w->send;
    char *out = w->recv;
    mt_sched s;
    mt_sched_init(&s, w, (int)(nch * (2 * peers + 1)));
    w->window = (int)(peers * slots);
    for (size_t k = 0; k < nch; k++) {
        size_t c0 = k * chunk, len = count - c0 < chunk ? count - c0 : chunk;
        uint32_t sub = sub_of(0, nch, k);
        char *slot = buf + (k % slots) * peers * chunk * esize;
        int reuse = k >= slots ? reduced[k % slots] : -1; /* the slot's previous reduction */
        int first_recv = -1;
        for (int i = 1; i <= (int)peers; i++) {
            int to = mod(g->r + i, g->n), from = mod(g->r - i, g->n);
            mt_sched_send(&s, to, sub, in + ((size_t)to * count + c0) * esize, len * esize, -1,
                          -1);
            int rv = mt_sched_recv(&s, from, sub, slot + (size_t)(i - 1) * chunk * esize,
                                   len * esize, reuse, -1);
            if (i == 1) first_recv = rv;
        }
        if (first_recv >= 0) {
            reduced[k % slots] = mt_sched_reduce_peers(&s, out + c0 * esize,
                                                       in + ((size_t)g->r * count + c0) * esize,
                                                       len, first_recv, 2);
            if (squares) mt_sched_squares(&s, reduced[k % slots], c0);
        }
    }
    free(reduced);
    return finish_rs(&s, squares);
}

static mt_status build_reduce_scatter(mt_work *w) {
    ring g;
    ring_init(&g, w);
    size_t bytes = w->count * g.esize;
    if (w->count == 0 || g.n == 1) return build_single(w, bytes);
    if (mt_comm_reduce_scatter_is_direct(w->count, g.esize, g.n, w->tr->small_bytes))
        return build_direct_reduce(w, &g, w->count, true);
    if (local_direct_rs(w, &g)) return build_local_reduce_scatter(w, &g);
    size_t nch = chunks_of(w->count, g.chunk);
    char *buf = scratch(w, 2 * bytes);
    if (!buf) return mt_error_wrap(MT_ERR_OUT_OF_MEMORY, "reduce_scatter: %zu bytes of scratch",
                                   2 * bytes);
    mt_sched s;
    mt_sched_init(&s, w, 3 * (g.n - 1) * (int)nch);
    bool squares = squares_inline(w, g.chunk, nch);
    ring_reduce_scatter(&s, w, &g, w->send, rs_off, w->recv, buf, buf + bytes, nch, squares);
    return finish_rs(&s, squares);
}

static mt_status build_all_reduce(mt_work *w) {
    ring g;
    ring_init(&g, w);
    size_t bytes = w->count * g.esize;
    if (w->count == 0 || g.n == 1) return build_single(w, bytes);
    if (mt_comm_all_reduce_is_direct(w->count, g.esize, g.n, w->tr->small_bytes))
        return build_direct_reduce(w, &g, w->count, false);
    size_t maxblock = mt_comm_ring_max_block(w->count, g.n);
    size_t nch = chunks_of(maxblock, g.chunk);
    char *buf = scratch(w, 2 * maxblock * g.esize);
    if (!buf) return mt_error_wrap(MT_ERR_OUT_OF_MEMORY, "all_reduce: %zu bytes of scratch",
                                   2 * maxblock * g.esize);
    char *out = w->recv;
    mt_sched s;
    mt_sched_init(&s, w, 5 * (g.n - 1) * (int)nch + 1);
    ring_reduce_scatter(&s, w, &g, w->send, ar_off, out + ar_off(w, g.r) * g.esize, buf,
                        buf + maxblock * g.esize, nch, false);
    /* The gather phase writes blocks the scatter phase may still read when send == recv: it
     * starts after the whole scatter phase (a join task). */
    int join = mt_sched_copy(&s, NULL, NULL, 0, true);
    int *prev_recv = malloc(nch * sizeof *prev_recv);
    if (!prev_recv) return mt_error(MT_ERR_OUT_OF_MEMORY, "all_reduce: schedule");
    for (int st = 0; st < g.n - 1; st++) {
        int send_block = mod(g.r - st, g.n), recv_block = mod(g.r - st - 1, g.n);
        size_t sb0 = ar_off(w, send_block), sblen = ar_off(w, send_block + 1) - sb0;
        size_t rb0 = ar_off(w, recv_block), rblen = ar_off(w, recv_block + 1) - rb0;
        for (size_t k = 0; k < nch; k++) {
            size_t c0 = k * g.chunk;
            uint32_t sub = sub_of((size_t)(g.n - 1 + st), nch, k);
            if (c0 < sblen) {
                size_t len = (sblen - c0 < g.chunk ? sblen - c0 : g.chunk) * g.esize;
                mt_sched_send(&s, g.right, sub, out + (sb0 + c0) * g.esize, len,
                              st == 0 ? join : prev_recv[k], -1);
            }
            prev_recv[k] = -1;
            if (c0 < rblen) {
                size_t len = (rblen - c0 < g.chunk ? rblen - c0 : g.chunk) * g.esize;
                prev_recv[k] = mt_sched_recv(&s, g.left, sub, out + (rb0 + c0) * g.esize, len,
                                             join, -1);
            }
        }
    }
    free(prev_recv);
    return mt_sched_finish(&s);
}

/* ---- broadcast, barrier, point-to-point ----------------------------------------------------- */

static mt_status build_broadcast(mt_work *w) {
    ring g;
    ring_init(&g, w);
    size_t bytes = w->count * g.esize;
    char *buf = w->recv;
    mt_sched s;
    if (w->count == 0 || g.n == 1) {
        mt_sched_init(&s, w, 1);
        return mt_sched_finish(&s);
    }
    if (bytes <= w->tr->small_bytes) {
        mt_sched_init(&s, w, g.n);
        w->window = g.n;
        if (g.r == w->root) {
            for (int i = 1; i < g.n; i++) mt_sched_send(&s, mod(g.r + i, g.n), 0, buf, bytes, -1, -1);
        } else {
            mt_sched_recv(&s, w->root, 0, buf, bytes, -1, -1);
        }
        return mt_sched_finish(&s);
    }
    int pos = mod(g.r - w->root, g.n);
    size_t nch = chunks_of(w->count, g.chunk);
    mt_sched_init(&s, w, 2 * (int)nch);
    for (size_t k = 0; k < nch; k++) {
        size_t off = k * g.chunk * g.esize;
        size_t len = (k + 1 == nch ? w->count - k * g.chunk : g.chunk) * g.esize;
        int recv_i = -1;
        if (pos > 0) recv_i = mt_sched_recv(&s, g.left, (uint32_t)k, buf + off, len, -1, -1);
        if (pos < g.n - 1) mt_sched_send(&s, g.right, (uint32_t)k, buf + off, len, recv_i, -1);
    }
    return mt_sched_finish(&s);
}

static mt_status build_barrier(mt_work *w) {
    int n = w->group->size, r = w->group->rank;
    mt_sched s;
    mt_sched_init(&s, w, 64);
    w->window = 2;
    int prev_recv = -1;
    for (int dist = 1, round = 0; dist < n; dist *= 2, round++) {
        mt_sched_send(&s, mod(r + dist, n), (uint32_t)round, NULL, 0, prev_recv, -1);
        prev_recv = mt_sched_recv(&s, mod(r - dist, n), (uint32_t)round, NULL, 0, -1, -1);
    }
    return mt_sched_finish(&s);
}

static mt_status build_p2p(mt_work *w) {
    mt_sched s;
    mt_sched_init(&s, w, 1);
    size_t bytes = w->count * mt_dtype_size(w->dtype);
    if (w->kind == MT_OP_SEND)
        mt_sched_send(&s, w->root, 0, w->send, bytes, -1, -1);
    else
        mt_sched_recv(&s, w->root, 0, w->recv, bytes, -1, -1);
    return mt_sched_finish(&s);
}

mt_status mt_schedule_build(mt_work *w) {
    switch (w->kind) {
    case MT_OP_ALL_GATHER: return build_all_gather(w);
    case MT_OP_REDUCE_SCATTER: return build_reduce_scatter(w);
    case MT_OP_ALL_REDUCE: return build_all_reduce(w);
    case MT_OP_BROADCAST: return build_broadcast(w);
    case MT_OP_BARRIER: return build_barrier(w);
    case MT_OP_SEND:
    case MT_OP_RECV: return build_p2p(w);
    }
    return mt_error(MT_ERR_INTERNAL, "unknown operation kind %d", (int)w->kind);
}
