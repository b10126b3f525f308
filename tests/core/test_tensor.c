/* Tensors: shapes, accessors, views sharing reference-counted storage, and clear errors. */
#include "check.h"

#include <meshtrain/tensor.h>

#include <string.h>

#define HAS(msg, part) (strstr((msg), (part)) != NULL)

static void test_create_and_access(mt_device *dev) {
    mt_tensor *t = NULL;
    CHECK_OK(mt_tensor_create(dev, MT_F32, 3, (int64_t[]){2, 3, 4}, MT_MEM_PARAMS, &t));
    if (!t) return;
    CHECK(mt_tensor_ndim(t) == 3);
    CHECK(mt_tensor_dim(t, 0) == 2 && mt_tensor_dim(t, 1) == 3 && mt_tensor_dim(t, 2) == 4);
    CHECK(mt_tensor_dim(t, -1) == 4 && mt_tensor_dim(t, -3) == 2);
    CHECK(mt_tensor_dim(t, 3) == -1 && mt_tensor_dim(t, -4) == -1);
    CHECK(mt_tensor_numel(t) == 24);
    CHECK(mt_tensor_nbytes(t) == 96);
    CHECK(mt_tensor_dtype(t) == MT_F32);
    CHECK(mt_tensor_device(t) == dev);
    CHECK(mt_tensor_category(t) == MT_MEM_PARAMS);
    CHECK(!mt_tensor_is_view(t));
    CHECK(mt_tensor_data(t) != NULL);
    char buf[64];
    CHECK(strcmp(mt_tensor_shape_str(t, buf, sizeof buf), "[2, 3, 4]") == 0);
    mt_mem_stats s;
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_PARAMS] == 96);
    mt_tensor_free(t);
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_PARAMS] == 0);

    CHECK_OK(mt_tensor_create(dev, MT_BF16, 2, (int64_t[]){5, 7}, MT_MEM_ACTIVATIONS, &t));
    CHECK(mt_tensor_nbytes(t) == 70);
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_ACTIVATIONS] == 70);
    mt_tensor_free(t);

    /* A scalar has no dims and one element; a zero-size dim gives no elements. */
    CHECK_OK(mt_tensor_create(dev, MT_F32, 0, NULL, MT_MEM_OTHER, &t));
    CHECK(mt_tensor_ndim(t) == 0 && mt_tensor_numel(t) == 1 && mt_tensor_nbytes(t) == 4);
    CHECK(strcmp(mt_tensor_shape_str(t, buf, sizeof buf), "[]") == 0);
    mt_tensor *v = NULL;
    CHECK(mt_tensor_narrow(t, 0, 1, &v) == MT_ERR_INVALID_ARG);
    mt_tensor_free(t);
    CHECK_OK(mt_tensor_create(dev, MT_F32, 2, (int64_t[]){0, 5}, MT_MEM_OTHER, &t));
    CHECK(mt_tensor_numel(t) == 0 && mt_tensor_nbytes(t) == 0 && mt_tensor_data(t) != NULL);
    CHECK_OK(mt_tensor_narrow(t, 0, 0, &v));
    CHECK(mt_tensor_numel(v) == 0 && mt_tensor_dim(v, 1) == 5);
    mt_tensor_free(v);
    mt_tensor_free(t);
    mt_tensor_free(NULL);

    CHECK_OK(mt_tensor_zeros(dev, MT_F32, 1, (int64_t[]){100}, MT_MEM_GRADS, &t));
    const float *z = mt_tensor_data(t);
    int nonzero = 0;
    for (int i = 0; i < 100; i++) nonzero += z[i] != 0.0f;
    CHECK(nonzero == 0);
    mt_tensor_free(t);
}

static void test_bad_shapes(mt_device *dev) {
    mt_tensor *t = (mt_tensor *)0x1;
    CHECK(mt_tensor_create(dev, MT_F32, 2, (int64_t[]){3, -2}, MT_MEM_OTHER, &t) ==
          MT_ERR_INVALID_ARG);
    CHECK(t == NULL);
    CHECK_MSG(HAS(mt_last_error(), "[3, -2]") && HAS(mt_last_error(), "negative"), "%s",
              mt_last_error());
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(mt_tensor_create(dev, MT_F32, 9, nine, MT_MEM_OTHER, &t) == MT_ERR_INVALID_ARG);
    CHECK_MSG(HAS(mt_last_error(), "9 dims"), "%s", mt_last_error());
    CHECK(mt_tensor_create(dev, MT_F32, -1, nine, MT_MEM_OTHER, &t) == MT_ERR_INVALID_ARG);
    CHECK(mt_tensor_create(dev, MT_F32, 2, NULL, MT_MEM_OTHER, &t) == MT_ERR_INVALID_ARG);
    CHECK(mt_tensor_create(dev, MT_DTYPE_COUNT, 1, nine, MT_MEM_OTHER, &t) == MT_ERR_INVALID_ARG);
    CHECK(mt_tensor_create(NULL, MT_F32, 1, nine, MT_MEM_OTHER, &t) == MT_ERR_INVALID_ARG);
    CHECK(mt_tensor_create(dev, MT_F32, 3, (int64_t[]){1ll << 40, 1ll << 40, 1ll << 40},
                           MT_MEM_OTHER, &t) == MT_ERR_INVALID_ARG);
    CHECK_MSG(HAS(mt_last_error(), "too many elements"), "%s", mt_last_error());
    /* Countable, but more bytes than an address space holds. */
    CHECK(mt_tensor_create(dev, MT_F32, 2, (int64_t[]){1ll << 31, 1ll << 31}, MT_MEM_OTHER, &t) ==
          MT_ERR_OUT_OF_MEMORY);
}

static void test_views(mt_device *dev) {
    mt_tensor *t = NULL, *row = NULL, *flat = NULL, *window = NULL, *inner = NULL;
    CHECK_OK(mt_tensor_create(dev, MT_F32, 3, (int64_t[]){4, 3, 2}, MT_MEM_PARAMS, &t));
    if (!t) return;
    float *base = mt_tensor_data(t);
    for (int i = 0; i < 24; i++) base[i] = (float)i;

    CHECK_OK(mt_tensor_narrow(t, 1, 2, &row));
    CHECK(mt_tensor_is_view(row));
    CHECK(mt_tensor_ndim(row) == 3 && mt_tensor_dim(row, 0) == 2 && mt_tensor_dim(row, 1) == 3);
    CHECK(mt_tensor_numel(row) == 12 && mt_tensor_nbytes(row) == 48);
    CHECK(mt_tensor_data(row) == base + 6);
    CHECK(mt_tensor_category(row) == MT_MEM_PARAMS && mt_tensor_device(row) == dev);

    CHECK_OK(mt_tensor_reshape(t, 2, (int64_t[]){-1, 6}, &flat));
    CHECK(mt_tensor_dim(flat, 0) == 4 && mt_tensor_dim(flat, 1) == 6);
    CHECK(mt_tensor_data(flat) == base);
    CHECK(mt_tensor_is_view(flat));

    CHECK_OK(mt_tensor_view(t, 5, 2, (int64_t[]){2, 3}, &window));
    CHECK(mt_tensor_data(window) == base + 5 && mt_tensor_numel(window) == 6);
    CHECK_OK(mt_tensor_view(t, 24, 1, (int64_t[]){0}, &inner)); /* empty, at the very end */
    mt_tensor_free(inner);

    /* Views of views compose their offsets. */
    CHECK_OK(mt_tensor_narrow(window, 1, 1, &inner));
    CHECK(mt_tensor_data(inner) == base + 8);
    CHECK(((float *)mt_tensor_data(inner))[2] == 10.0f);

    /* The parent goes first: the storage stays (and stays charged) while views use it. */
    mt_mem_stats s;
    mt_tensor_free(t);
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_PARAMS] == 96);
    const float *r = mt_tensor_data(row);
    CHECK(r[0] == 6.0f && r[11] == 17.0f);
    mt_tensor_free(row);
    mt_tensor_free(flat);
    mt_tensor_free(window);
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_PARAMS] == 96);
    CHECK(((float *)mt_tensor_data(inner))[0] == 8.0f);
    mt_tensor_free(inner);
    mt_device_mem_stats(dev, &s);
    CHECK(s.current[MT_MEM_PARAMS] == 0);
}

static void test_view_errors(mt_device *dev) {
    mt_tensor *t = NULL, *v = (mt_tensor *)0x1;
    CHECK_OK(mt_tensor_create(dev, MT_F32, 3, (int64_t[]){2, 3, 4}, MT_MEM_OTHER, &t));
    if (!t) return;
    const char *m;

    CHECK(mt_tensor_narrow(t, 1, 2, &v) == MT_ERR_INVALID_ARG);
    CHECK(v == NULL);
    m = mt_last_error();
    CHECK_MSG(HAS(m, "[2, 3, 4]") && HAS(m, "start 1, length 2") && HAS(m, "size 2"), "%s", m);
    CHECK(mt_tensor_narrow(t, -1, 1, &v) == MT_ERR_INVALID_ARG);
    CHECK(mt_tensor_narrow(t, 3, 0, &v) == MT_ERR_INVALID_ARG);
    CHECK(mt_tensor_narrow(t, 0, -1, &v) == MT_ERR_INVALID_ARG);
    CHECK(mt_tensor_narrow(t, 1, INT64_MAX, &v) == MT_ERR_INVALID_ARG);

    CHECK(mt_tensor_reshape(t, 2, (int64_t[]){5, 5}, &v) == MT_ERR_INVALID_ARG);
    m = mt_last_error();
    CHECK_MSG(HAS(m, "[2, 3, 4]") && HAS(m, "[5, 5]") && HAS(m, "24 elements") &&
                  HAS(m, "25 elements"),
              "%s", m);
    CHECK(mt_tensor_reshape(t, 2, (int64_t[]){-1, 5}, &v) == MT_ERR_INVALID_ARG);
    CHECK_MSG(HAS(mt_last_error(), "[-1, 5]"), "%s", mt_last_error());
    CHECK(mt_tensor_reshape(t, 2, (int64_t[]){-1, -1}, &v) == MT_ERR_INVALID_ARG);
    CHECK_MSG(HAS(mt_last_error(), "more than one -1"), "%s", mt_last_error());
    CHECK(mt_tensor_reshape(t, 2, (int64_t[]){-2, -12}, &v) == MT_ERR_INVALID_ARG);
    CHECK(mt_tensor_reshape(t, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 24}, &v) ==
          MT_ERR_INVALID_ARG);
    CHECK_OK(mt_tensor_reshape(t, 1, (int64_t[]){24}, &v));
    mt_tensor_free(v);

    CHECK(mt_tensor_view(t, 20, 1, (int64_t[]){5}, &v) == MT_ERR_INVALID_ARG);
    m = mt_last_error();
    CHECK_MSG(HAS(m, "[5]") && HAS(m, "offset 20") && HAS(m, "[2, 3, 4]"), "%s", m);
    CHECK(mt_tensor_view(t, -1, 1, (int64_t[]){1}, &v) == MT_ERR_INVALID_ARG);
    CHECK(mt_tensor_view(t, 25, 0, NULL, &v) == MT_ERR_INVALID_ARG);
    CHECK(mt_tensor_view(t, INT64_MAX, 1, (int64_t[]){INT64_MAX}, &v) == MT_ERR_INVALID_ARG);
    mt_tensor_free(t);
}

static void test_out_of_memory(void) {
    mt_device *small = NULL;
    CHECK_OK(mt_device_open_cpu(1024, &small));
    if (!small) return;
    mt_tensor *t = NULL;
    CHECK(mt_tensor_create(small, MT_F32, 2, (int64_t[]){16, 32}, MT_MEM_ACTIVATIONS, &t) ==
          MT_ERR_OUT_OF_MEMORY);
    const char *m = mt_last_error();
    CHECK_MSG(HAS(m, "out of memory") && HAS(m, "[16, 32]") && HAS(m, "activations") &&
                  HAS(m, "2.00 KiB"),
              "%s", m);
    CHECK(t == NULL);
    mt_mem_stats s;
    mt_device_mem_stats(small, &s);
    CHECK(s.total_current == 0);
    mt_device_close(small);
}

int main(void) {
    mt_device *dev = NULL;
    CHECK_OK(mt_device_open_cpu(0, &dev));
    if (!dev) return check_report("test_tensor");
    test_create_and_access(dev);
    test_bad_shapes(dev);
    test_views(dev);
    test_view_errors(dev);
    test_out_of_memory();
    mt_mem_stats s;
    mt_device_mem_stats(dev, &s);
    CHECK_MSG(s.total_current == 0, "%zu bytes still charged: a tensor leaked its storage",
              s.total_current);
    mt_device_close(dev);
    return check_report("test_tensor");
}
