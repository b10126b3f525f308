/* Offload staging on a GPU (include/meshtrain/stage.h): a page-locked host-tier block to device
 * memory and back into a second host block, for 0, 1, 4095 bytes and 16 MiB at odd offsets,
 * bit-exact, with 8 copies in flight; whichever path the UCX allows (ucx with a CUDA-enabled UCX,
 * device-copy otherwise), printed; ucx is required when the build's UCX has CUDA transports
 * (MT_UCX_ROOT, cmake/ucx.cmake). Also an injected pinned-allocation failure of the host tier.
 * Exits 77 (ctest: skipped) without a GPU. */
#include "check.h"
#include "numeric.h"

#include <meshtrain/device.h>
#include <meshtrain/host_memory.h>
#include <meshtrain/stage.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SKIPPED 77
#define BIG ((size_t)16 << 20)
#define SLACK 4096

int main(void) {
    if (mt_device_cuda_count(NULL, 0) == 0) {
        printf("test_gpu_stage: skipped, no GPU\n");
        return SKIPPED;
    }
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open(MT_DEVICE_CUDA, 0, &dev));
    if (!dev) return check_report("test_gpu_stage");
    mt_stager *st = NULL;
    CHECK_OK(mt_stager_create(dev, &st));
    if (!st) return check_report("test_gpu_stage");
    printf("staging path: %s\n", mt_stage_path_name(mt_stager_path(st)));
#ifdef MT_TEST_EXPECT_UCX_PATH
    /* Built against a UCX with CUDA transports (MT_UCX_ROOT), which the programs load first. */
    CHECK_MSG(mt_stager_path(st) == MT_STAGE_PATH_UCX, "a UCX with CUDA transports was built "
              "against, yet the stager fell back to %s (is cuda_copy loading? ucx_info -d)",
              mt_stage_path_name(mt_stager_path(st)));
#endif
    unsigned char *in = NULL, *out = NULL, *gpu = NULL;
    CHECK_OK(mt_host_tier_alloc(dev, BIG + SLACK, MT_MEM_PARAMS, (void **)&in));
    CHECK_OK(mt_host_tier_alloc(dev, BIG + SLACK, MT_MEM_GRADS, (void **)&out));
    CHECK_OK(mt_device_alloc(dev, BIG + SLACK, MT_MEM_PARAMS, (void **)&gpu));
    CHECK_OK(mt_stager_register(st, in, BIG + SLACK));
    CHECK_OK(mt_stager_register(st, out, BIG + SLACK));
    CHECK_OK(mt_stager_register(st, gpu, BIG + SLACK));

    size_t sizes[] = {0, 1, 4095, BIG};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k], off = k ? 3 : 0, goff = k ? 4093 : 0;
        test_fill_bytes(in + off, n, (unsigned)k);
        memset(out, 0xA5, BIG + SLACK);
        mt_stage_copy *c = NULL;
        CHECK_OK(mt_stage_copy_async(st, gpu + goff, in + off, n, MT_COPY_HOST_TO_DEVICE, &c));
        CHECK_OK(mt_stage_wait(c));
        CHECK_OK(mt_stage_copy_async(st, out + off, gpu + goff, n, MT_COPY_DEVICE_TO_HOST, &c));
        CHECK_OK(mt_stage_wait(c));
        CHECK_MSG(memcmp(out + off, in + off, n) == 0, "%zu bytes round trip", n);
        CHECK(out[off + n] == 0xA5);
    }

    enum { COPIES = 8 };
    size_t chunk = BIG / COPIES;
    test_fill_bytes(in, BIG, 99);
    memset(out, 0, BIG);
    mt_stage_copy *c[COPIES];
    for (int i = 0; i < COPIES; i++)
        CHECK_OK(mt_stage_copy_async(st, gpu + i * chunk, in + i * chunk, chunk,
                                     MT_COPY_HOST_TO_DEVICE, &c[i]));
    for (int i = 0; i < COPIES; i++) CHECK_OK(mt_stage_wait(c[i]));
    for (int i = 0; i < COPIES; i++)
        CHECK_OK(mt_stage_copy_async(st, out + i * chunk, gpu + i * chunk, chunk,
                                     MT_COPY_DEVICE_TO_HOST, &c[i]));
    for (int i = 0; i < COPIES; i++) {
        bool done = false;
        while (!done) CHECK_OK(mt_stage_test(c[i], &done));
        CHECK_OK(mt_stage_wait(c[i]));
    }
    CHECK(memcmp(out, in, BIG) == 0);

    setenv("MT_TEST_HOST_ALLOC_FAIL", "1", 1);
    void *p = NULL;
    mt_status s = mt_host_tier_alloc(dev, 1u << 20, MT_MEM_OPTIMIZER, &p);
    unsetenv("MT_TEST_HOST_ALLOC_FAIL");
    CHECK(s == MT_ERR_OUT_OF_MEMORY && p == NULL);
    CHECK_MSG(strstr(mt_last_error(), "page-locked") && strstr(mt_last_error(), "cudaMallocHost")
              && strstr(mt_last_error(), "optimizer"), "%s", mt_last_error());

    mt_stager_destroy(st);
    mt_host_tier_free(dev, in);
    mt_host_tier_free(dev, out);
    mt_device_free(dev, gpu);
    mt_device_close(dev);
    return check_report("test_gpu_stage");
}
