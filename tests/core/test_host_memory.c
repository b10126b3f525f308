/* Host memory helpers under the comm path: non-temporal copies (core/copy_stream.c) give the same
 * bytes as memcpy for every alignment and size around their thresholds; large CPU-device blocks
 * are shared memory whose ranges are found from any pointer inside them (core/shm_block.h),
 * small ones are not, and MT_CPU_SHARED_MEMORY=0 turns sharing off. */
#include "check.h"

#include "core/copy_stream.h"
#include "core/shm_block.h"

#include <meshtrain/device.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

static void test_copy_stream(void) {
    size_t cap = (1u << 20) + 256;
    unsigned char *src = malloc(cap), *dst = malloc(cap + 64), *want = malloc(cap + 64);
    for (size_t i = 0; i < cap; i++) src[i] = (unsigned char)(i * 131 + 7);
    size_t sizes[] = {0, 1, 63, 64, 65, 4095, (256u << 10) - 1, 256u << 10, (256u << 10) + 17,
                      1u << 20};
    int bad = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        for (size_t so = 0; so < 3; so++) {
            for (size_t doff = 0; doff < 19; doff += 9) {
                size_t n = sizes[k];
                memset(dst, 0xAB, cap + 64);
                memset(want, 0xAB, cap + 64);
                memcpy(want + doff, src + so, n);
                mt_copy_stream(dst + doff, src + so, n);
                if (memcmp(dst, want, cap + 64) != 0) {
                    bad++;
                    fprintf(stderr, "copy of %zu bytes (src +%zu, dst +%zu) differs\n", n, so,
                            doff);
                }
            }
        }
    }
    CHECK(bad == 0);
    free(src);
    free(dst);
    free(want);
}

static int fcntl_ok(int fd) { return fcntl(fd, F_GETFD) >= 0; }

static void test_shared_blocks(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return;
    void *big = NULL, *small = NULL;
    CHECK_OK(mt_device_alloc(dev, 3u << 20, MT_MEM_COMM, &big));
    CHECK_OK(mt_device_alloc(dev, 4096, MT_MEM_COMM, &small));
    mt_shm_ref ref;
    memset(&ref, 0, sizeof ref);
    CHECK(mt_device_shared_range(dev, (char *)big + 1000, 1u << 20, &ref));
    CHECK(ref.pid == (int32_t)getpid());
    CHECK(ref.offset == 1000);
    CHECK(ref.block_size >= (3u << 20));
    CHECK(ref.fd >= 0 && fcntl_ok(ref.fd));
    /* a range that runs past the block's end is not shared */
    CHECK(!mt_device_shared_range(dev, (char *)big + (3u << 20) - 10, 4096 * 2, &ref));
    CHECK(!mt_device_shared_range(dev, small, 16, &ref));
    /* the block is really shared memory: a second mapping of its fd sees the same bytes */
    memset(big, 0x5C, 3u << 20);
    CHECK(mt_device_shared_range(dev, big, 1, &ref));
    unsigned char *view = mmap(NULL, ref.block_size, PROT_READ, MAP_SHARED, ref.fd, 0);
    CHECK(view != MAP_FAILED);
    if (view != MAP_FAILED) {
        CHECK(view[0] == 0x5C && view[(3u << 20) - 1] == 0x5C);
        munmap(view, ref.block_size);
    }
    uint64_t serial = ref.serial;
    mt_device_free(dev, big);
    /* A different size than the freed block: a new block, with a new serial (a block of the
     * same size would be the freed one again, from the cache: tests/core/test_device_cache.c). */
    CHECK_OK(mt_device_alloc(dev, 8u << 20, MT_MEM_COMM, &big));
    CHECK(mt_device_shared_range(dev, big, 1, &ref) && ref.serial != serial);
    mt_device_free(dev, big);
    mt_device_free(dev, small);
    mt_device_close(dev);

    setenv("MT_CPU_SHARED_MEMORY", "0", 1);
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return;
    CHECK_OK(mt_device_alloc(dev, 3u << 20, MT_MEM_COMM, &big));
    CHECK(!mt_device_shared_range(dev, big, 1, &ref));
    mt_device_free(dev, big);
    mt_device_close(dev);
    unsetenv("MT_CPU_SHARED_MEMORY");
}

int main(void) {
    test_copy_stream();
    test_shared_blocks();
    return check_report("test_host_memory");
}
