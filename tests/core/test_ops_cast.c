/* mt_op_cast and mt_op_accumulate on the CPU device: the same bits as the dtype module's
 * conversions (every bf16 pattern, ties, NaN), accumulation from f32 and bf16, argument errors. */
#include "check.h"

#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/ops.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return check_report("test_ops_cast");
    enum { N = 65536 };
    uint16_t *bits = malloc(N * sizeof *bits), *back = malloc(N * sizeof *back);
    float *f = malloc(N * sizeof *f), *acc = malloc(N * sizeof *acc);
    for (int i = 0; i < N; i++) bits[i] = (uint16_t)i;
    /* bf16 -> f32 -> bf16 gives every pattern back (NaNs stay NaN with the quiet bit). */
    CHECK_OK(mt_op_cast(dev, bits, MT_BF16, f, MT_F32, N));
    CHECK_OK(mt_op_cast(dev, f, MT_F32, back, MT_BF16, N));
    int wrong = 0;
    for (int i = 0; i < N; i++) {
        float want = mt_bf16_to_f32((mt_bf16)bits[i]);
        if (memcmp(&f[i], &want, sizeof want) != 0) wrong++;
        if (back[i] != (uint16_t)mt_f32_to_bf16(f[i])) wrong++;
    }
    CHECK_MSG(wrong == 0, "%d casts differ from the dtype module's", wrong);
    /* f32 -> bf16 on values between bf16 steps: the same rounding (ties to even). */
    for (int i = 0; i < N; i++) f[i] = 1.0f + (float)i / 65536.0f * 0.03125f;
    CHECK_OK(mt_op_cast(dev, f, MT_F32, back, MT_BF16, N));
    wrong = 0;
    for (int i = 0; i < N; i++) wrong += back[i] != (uint16_t)mt_f32_to_bf16(f[i]);
    CHECK_MSG(wrong == 0, "%d roundings differ", wrong);
    /* Same dtype: a copy. */
    CHECK_OK(mt_op_cast(dev, f, MT_F32, acc, MT_F32, N));
    CHECK(memcmp(f, acc, N * sizeof *f) == 0);
    /* Accumulate f32 and bf16 sources. */
    for (int i = 0; i < N; i++) acc[i] = 2.0f;
    CHECK_OK(mt_op_accumulate(dev, acc, f, MT_F32, N));
    CHECK_OK(mt_op_accumulate(dev, acc, back, MT_BF16, N));
    wrong = 0;
    for (int i = 0; i < N; i++)
        wrong += acc[i] != (2.0f + f[i]) + mt_bf16_to_f32((mt_bf16)back[i]);
    CHECK_MSG(wrong == 0, "%d accumulations differ", wrong);
    /* Errors name the op. */
    CHECK(mt_op_cast(dev, f, (mt_dtype)99, back, MT_BF16, 1) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "cast") != NULL);
    CHECK(mt_op_accumulate(dev, NULL, f, MT_F32, 1) == MT_ERR_INVALID_ARG);
    CHECK_OK(mt_op_accumulate(dev, NULL, NULL, MT_F32, 0));
    free(bits), free(back), free(f), free(acc);
    mt_device_close(dev);
    return check_report("test_ops_cast");
}
