/* The CUDA caching allocator's bookkeeping (core/cuda/block_cache.c) on fake addresses: it has no
 * CUDA calls, so it runs on any machine of a CUDA build. */
#include "core/cuda/block_cache.h"

#include "check.h"

#include <stdint.h>
#include <stdlib.h>

#define MIB ((size_t)1 << 20)

static void *fake(uintptr_t x) { return (void *)(x * 256); }

static void test_round(void) {
    CHECK(mt_block_round(0) == 512);
    CHECK(mt_block_round(1) == 512);
    CHECK(mt_block_round(512) == 512);
    CHECK(mt_block_round(513) == 1024);
    CHECK(mt_block_round(MIB - 1) == MIB);
    CHECK(mt_block_round(MIB) == 2 * MIB);
    CHECK(mt_block_round(2 * MIB) == 2 * MIB);
    CHECK(mt_block_round(2 * MIB + 1) == 4 * MIB);
    CHECK(mt_block_round(SIZE_MAX) == 0);
    CHECK(mt_block_round(SIZE_MAX - 4 * MIB) % (2 * MIB) == 0);
    CHECK(mt_block_round(SIZE_MAX - 4 * MIB) >= SIZE_MAX - 4 * MIB);
}

static void test_live(void) {
    mt_block_list live = {0};
    enum { N = 500 };
    /* Insert in a scrambled order: 7 is coprime to N. */
    size_t total = 0;
    for (uintptr_t i = 0; i < N; i++) {
        uintptr_t k = (i * 7) % N + 1;
        CHECK(mt_block_live_add(&live, fake(k), k * 512));
        total += k * 512;
    }
    CHECK(live.n == N);
    CHECK(live.bytes == total);
    CHECK(!mt_block_live_add(&live, fake(3), 1));
    for (size_t i = 1; i < live.n; i++) CHECK((uintptr_t)live.v[i - 1].ptr < (uintptr_t)live.v[i].ptr);
    size_t size = 0;
    CHECK(!mt_block_live_remove(&live, fake(N + 1), &size));
    for (uintptr_t k = 1; k <= N; k += 2) {
        CHECK(mt_block_live_remove(&live, fake(k), &size));
        CHECK_MSG(size == k * 512, "block %zu: size %zu", (size_t)k, size);
        total -= k * 512;
    }
    CHECK(!mt_block_live_remove(&live, fake(1), &size));
    CHECK(live.n == N / 2);
    CHECK(live.bytes == total);
    mt_block_list_release(&live);
    CHECK(live.n == 0 && live.v == NULL);
}

static void test_cache_fit(void) {
    mt_block_list cache = {0};
    CHECK(mt_block_cache_largest(&cache) == 0);
    bool pending = true;
    CHECK(mt_block_cache_find(&cache, 512, 100, &pending) == -1 && !pending);
    CHECK(mt_block_cache_put(&cache, (mt_cached_block){fake(1), 1024, 1}));
    CHECK(mt_block_cache_put(&cache, (mt_cached_block){fake(2), 4 * MIB, 5}));
    CHECK(mt_block_cache_put(&cache, (mt_cached_block){fake(3), 4 * MIB, 2}));
    CHECK(mt_block_cache_put(&cache, (mt_cached_block){fake(4), 8 * MIB, 3}));
    CHECK(mt_block_cache_put(&cache, (mt_cached_block){fake(5), 512, 4}));
    CHECK(cache.bytes == 512 + 1024 + 16 * MIB);
    CHECK(mt_block_cache_largest(&cache) == 8 * MIB);

    /* Only the block freed at 2 is ready at 2. */
    long i = mt_block_cache_find(&cache, 4 * MIB, 2, &pending);
    CHECK(i >= 0 && cache.v[i].ptr == fake(3));
    /* Nothing ready yet, but blocks of the size exist. */
    CHECK(mt_block_cache_find(&cache, 4 * MIB, 1, &pending) == -1 && pending);
    /* 2 MiB would waste half of a 4 MiB block: no fit. */
    CHECK(mt_block_cache_find(&cache, 2 * MIB, 100, &pending) == -1 && !pending);
    /* 8 MiB fits only the 8 MiB block; 1024 only the 1024 block (512 is too small). */
    i = mt_block_cache_find(&cache, 8 * MIB, 100, &pending);
    CHECK(i >= 0 && cache.v[i].ptr == fake(4));
    i = mt_block_cache_find(&cache, 1024, 100, &pending);
    CHECK(i >= 0 && cache.v[i].ptr == fake(1));

    mt_cached_block b = mt_block_cache_take(&cache, (size_t)i);
    CHECK(b.ptr == fake(1) && b.size == 1024 && b.freed_seq == 1);
    CHECK(cache.n == 4 && cache.bytes == 512 + 16 * MIB);
    CHECK(mt_block_cache_find(&cache, 1024, 100, &pending) == -1);
    mt_block_list_release(&cache);
}

/* Random puts and finds against a brute-force best fit. */
static void test_cache_random(void) {
    mt_block_list cache = {0};
    srand(12345);
    uint64_t seq = 0;
    for (int step = 0; step < 4000; step++) {
        size_t size = mt_block_round((size_t)(rand() % 64 + 1) * ((rand() % 2) ? 4096 : 512 * 1024));
        if (rand() % 2) {
            CHECK(mt_block_cache_put(&cache, (mt_cached_block){fake((uintptr_t)step + 1), size,
                                                               ++seq}));
            continue;
        }
        uint64_t ready = seq ? (uint64_t)rand() % (seq + 1) : 0;
        long want = -1;
        bool want_pending = false;
        for (size_t j = 0; j < cache.n; j++) {
            size_t s = cache.v[j].size;
            if (s < size || s - size > size / 8) continue;
            if (cache.v[j].freed_seq > ready) {
                want_pending = true;
                continue;
            }
            if (want < 0 || s < cache.v[want].size ||
                (s == cache.v[want].size && cache.v[j].freed_seq < cache.v[want].freed_seq))
                want = (long)j;
        }
        bool pending = false;
        long got = mt_block_cache_find(&cache, size, ready, &pending);
        CHECK_MSG((got < 0) == (want < 0), "step %d: found %ld, expected %ld", step, got, want);
        if (got >= 0 && want >= 0) {
            CHECK(cache.v[got].size == cache.v[want].size);
            mt_block_cache_take(&cache, (size_t)got);
        } else {
            CHECK(pending == want_pending);
        }
    }
    size_t sum = 0;
    for (size_t j = 0; j < cache.n; j++) {
        sum += cache.v[j].size;
        if (j) CHECK(cache.v[j - 1].size <= cache.v[j].size);
    }
    CHECK(sum == cache.bytes);
    mt_block_list_release(&cache);
}

int main(void) {
    test_round();
    test_live();
    test_cache_fit();
    test_cache_random();
    return check_report("test_block_cache");
}
