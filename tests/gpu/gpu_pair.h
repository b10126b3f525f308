/* The two devices of a GPU-against-CPU op test: the CPU device (the reference) and the device
 * under test, the GPU, or with MT_TEST_OPS_SELF=1 a second CPU device (a check of the test's own
 * bookkeeping on a machine without a GPU). */
#ifndef MT_TESTS_GPU_PAIR_H
#define MT_TESTS_GPU_PAIR_H

#include "check.h"

#include <meshtrain/device.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Exit status that ctest reports as skipped (SKIP_RETURN_CODE in tests/gpu/gpu.cmake). */
#define SKIPPED 77

/* Opens *cpu and *gpu; *self_check says whether *gpu is the MT_TEST_OPS_SELF stand-in. Returns -1
 * when both are open and the test goes on, else the exit status of the program: SKIPPED without
 * a GPU, or check_report's failure when a device did not open or the GPU fell back to the CPU. */
static inline int gpu_pair_open(const char *name, mt_device **cpu, mt_device **gpu,
                                bool *self_check) {
    const char *self = getenv("MT_TEST_OPS_SELF");
    *self_check = self && strcmp(self, "1") == 0;
    char why[256] = "";
    if (!*self_check && mt_device_cuda_count(why, sizeof why) == 0) {
        printf("%s: skipped, no GPU (%s)\n", name, why);
        return SKIPPED;
    }
    CHECK_OK(mt_device_open_cpu(0, cpu));
    if (*self_check) CHECK_OK(mt_device_open_cpu(0, gpu));
    else CHECK_OK(mt_device_open(MT_DEVICE_CUDA, 0, gpu));
    CHECK_MSG(*self_check || !*gpu || !mt_device_is_fallback(*gpu),
              "a GPU was counted but cuda:0 opened as the CPU fallback");
    if (!*cpu || !*gpu || check_failed_) return check_report(name);
    return -1;
}

#endif
