/* A program outside the meshtrain tree, built against the installed package: it only sees the
 * public headers and the installed library. Exits 0 when every call gave the expected result. */
#include <meshtrain/meshtrain.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures;

#define EXPECT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "consumer: %s:%d: expected %s (%s)\n", __FILE__, __LINE__, #cond,      \
                    mt_last_error());                                                              \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

int main(void) {
    EXPECT(strcmp(mt_version(), "0.1.0") >= 0 && strchr(mt_version(), '.') != NULL);

    EXPECT(mt_f32_to_bf16(1.0f) == 0x3f80);
    EXPECT(mt_bf16_to_f32(0x4049) == 3.140625f);
    mt_dtype dtype;
    EXPECT(mt_dtype_parse("bfloat16", &dtype) == MT_OK && dtype == MT_BF16);

    size_t bytes = 0;
    EXPECT(mt_parse_bytes("2 MiB", &bytes) == MT_OK && bytes == 2u << 20);

    mt_device *dev = NULL;
    EXPECT(mt_device_open_cpu(1u << 20, &dev) == MT_OK);
    if (!dev) return 1;
    void *p = NULL;
    EXPECT(mt_device_alloc(dev, 4096, MT_MEM_PARAMS, &p) == MT_OK && p != NULL);
    if (p) memset(p, 0, 4096);
    void *too_big = NULL;
    EXPECT(mt_device_alloc(dev, 2u << 20, MT_MEM_ACTIVATIONS, &too_big) == MT_ERR_OUT_OF_MEMORY);
    EXPECT(strstr(mt_last_error(), "out of memory") != NULL);
    mt_mem_stats stats;
    mt_device_mem_stats(dev, &stats);
    EXPECT(stats.current[MT_MEM_PARAMS] == 4096 && stats.capacity == 1u << 20);
    mt_device_free(dev, p);
    mt_device_mem_stats(dev, &stats);
    EXPECT(stats.total_current == 0 && stats.total_peak == 4096);

    float *act = NULL;
    EXPECT(mt_device_alloc(dev, 32 * mt_dtype_size(MT_F32), MT_MEM_ACTIVATIONS, (void **)&act) ==
           MT_OK);
    EXPECT(mt_device_memset(dev, act, 0, 128, NULL) == MT_OK && act && act[31] == 0.0f);
    mt_device_mem_stats(dev, &stats);
    EXPECT(stats.current[MT_MEM_ACTIVATIONS] == 128 && strcmp(mt_dtype_name(MT_F32), "f32") == 0);
    mt_device_free(dev, act);
    mt_device_close(dev);

    printf("consumer: meshtrain %s: %s\n", mt_version(), failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
