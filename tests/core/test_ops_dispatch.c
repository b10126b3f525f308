/* The public ops' dispatch (core/ops.c): a NULL device and bad sizes are refused with a sentence
 * before any implementation runs, and a device opened as CUDA on a machine without a GPU (the CPU
 * fallback) computes on the CPU. On a GPU machine the fallback part is skipped: tests/gpu covers
 * the CUDA implementations. */
#include "check.h"

#include <meshtrain/device.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <string.h>

static void test_refusals(void) {
    float x[4] = {0};
    CHECK(mt_op_gemm(NULL, false, false, 1, 1, 1, 1.0f, x, x, 0.0f, x) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "gemm: the device is NULL") != NULL);
    CHECK(mt_op_gelu_forward(NULL, x, x, 1) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "gelu_forward") != NULL);
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return;
    CHECK(mt_op_gemm(dev, false, false, -1, 1, 1, 1.0f, x, x, 0.0f, x) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "negative size") != NULL);
    CHECK(mt_op_add(dev, x, NULL, x, 2) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "the second input is NULL") != NULL);
    CHECK(mt_op_adamw(dev, x, x, x, x, 1, 0, 0.1f, 0.9f, 0.99f, 1e-8f, 0.0f) ==
          MT_ERR_INVALID_ARG);
    CHECK(mt_op_attention_forward(dev, x, 1, 1, 1, 0, x, x) == MT_ERR_INVALID_ARG);
    /* Empty work is fine with NULL buffers. */
    CHECK_OK(mt_op_relu_forward(dev, NULL, NULL, 0));
    mt_device_close(dev);
}

static void test_fallback_computes(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open(MT_DEVICE_CUDA, 0, &dev));
    if (!dev) return;
    CHECK(mt_device_get_kind(dev) == MT_DEVICE_CPU && mt_device_is_fallback(dev));
    /* [1 2; 3 4] * [5 6; 7 8] = [19 22; 43 50] */
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {0};
    CHECK_OK(mt_op_gemm(dev, false, false, 2, 2, 2, 1.0f, a, b, 0.0f, c));
    CHECK(c[0] == 19.0f && c[1] == 22.0f && c[2] == 43.0f && c[3] == 50.0f);
    float in[3] = {-1.0f, 0.0f, 2.0f}, out[3] = {0};
    CHECK_OK(mt_op_gelu_forward(dev, in, out, 3));
    CHECK(out[1] == 0.0f && fabsf(out[2] - 1.9545977f) < 1e-6f && out[0] < 0.0f);
    mt_device_close(dev);
}

int main(void) {
    test_refusals();
    if (mt_device_cuda_count(NULL, 0) == 0) test_fallback_computes();
    return check_report("test_ops_dispatch");
}
