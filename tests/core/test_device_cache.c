/* The CPU device's cache of freed shared-memory blocks (core/cpu/device_cpu.c): a block freed and
 * asked for again with nearly the same size comes back (same mapping, same serial, so peers'
 * mappings stay valid) while the accounting counts only what is allocated; other sizes get new
 * blocks; MT_CPU_CACHE_BYTES=0 turns it off; a malformed value is an error naming it. */
#include "check.h"

#include "core/shm_block.h"

#include <meshtrain/device.h>
#include <meshtrain/status.h>

#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

static uint64_t serial_of(mt_device *dev, void *p, size_t bytes) {
    mt_shm_ref ref;
    return mt_device_shared_range(dev, p, bytes, &ref) ? ref.serial : 0;
}

static void check_reuse(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return;
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(mt_device_alloc(dev, 4 * MIB, MT_MEM_PARAMS, &a));
    uint64_t sa = serial_of(dev, a, 4 * MIB);
    CHECK_MSG(sa != 0, "a 4 MiB block is shared memory");
    memset(a, 7, 4 * MIB);
    mt_device_free(dev, a);
    CHECK_MSG(serial_of(dev, a, 1) == 0, "a freed block is no longer a shared range");
    mt_mem_stats st;
    mt_device_mem_stats(dev, &st);
    CHECK_MSG(st.current[MT_MEM_PARAMS] == 0, "freed bytes are not counted");

    CHECK_OK(mt_device_alloc(dev, 4 * MIB - 4096, MT_MEM_GRADS, &b));
    CHECK_MSG(b == a && serial_of(dev, b, 1) == sa, "the cached block comes back (%p vs %p)", b, a);
    mt_device_mem_stats(dev, &st);
    CHECK(st.current[MT_MEM_GRADS] == 4 * MIB - 4096 && st.total_current == 4 * MIB - 4096);

    /* A much smaller request does not take a big cached block. */
    mt_device_free(dev, b);
    CHECK_OK(mt_device_alloc(dev, 1 * MIB, MT_MEM_PARAMS, &c));
    uint64_t sc = serial_of(dev, c, 1 * MIB);
    CHECK_MSG(sc != 0 && sc != sa, "a 1 MiB request gets its own block");
    mt_device_free(dev, c);
    mt_device_close(dev);
}

static void check_disabled(void) {
    setenv("MT_CPU_CACHE_BYTES", "0", 1);
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (dev) {
        void *a = NULL, *b = NULL;
        CHECK_OK(mt_device_alloc(dev, 4 * MIB, MT_MEM_PARAMS, &a));
        uint64_t sa = serial_of(dev, a, 1);
        CHECK_MSG(sa != 0, "a 4 MiB block is shared memory with the cache off too");
        mt_device_free(dev, a);
        CHECK_OK(mt_device_alloc(dev, 4 * MIB, MT_MEM_PARAMS, &b));
        CHECK_MSG(serial_of(dev, b, 1) != sa, "without the cache every block is new");
        mt_device_free(dev, b);
        mt_device_close(dev);
    }
    setenv("MT_CPU_CACHE_BYTES", "lots", 1);
    dev = NULL;
    CHECK(mt_device_open_cpu(0, &dev) == MT_ERR_INVALID_ARG && dev == NULL);
    CHECK_MSG(strstr(mt_last_error(), "MT_CPU_CACHE_BYTES") != NULL, "error: %s", mt_last_error());
    unsetenv("MT_CPU_CACHE_BYTES");
}

int main(void) {
    unsetenv("MT_CPU_CACHE_BYTES");
    unsetenv("MT_CPU_SHARED_MEMORY");
    check_reuse();
    check_disabled();
    return check_report("test_device_cache");
}
