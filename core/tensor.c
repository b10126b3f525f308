/* Tensors over reference-counted device storage. Every tensor is contiguous, so a view is just a
 * byte offset into the storage and a shape. */
#include "core/error.h"

#include <meshtrain/tensor.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct mt_storage {
    mt_device *dev;
    void *data;
    size_t nbytes;
    mt_mem_category category;
    atomic_int refs;
} mt_storage;

struct mt_tensor {
    mt_storage *storage;
    size_t offset; /* bytes from the start of the storage */
    mt_dtype dtype;
    int ndim;
    int64_t shape[MT_TENSOR_MAX_DIMS];
    int64_t numel;
    bool is_view;
};

static const char *shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t used = 0;
    int n = snprintf(buf, cap, "[");
    if (n > 0) used = (size_t)n;
    for (int i = 0; i < ndim && used < cap; i++) {
        n = snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (n > 0) used += (size_t)n;
    }
    if (used < cap) snprintf(buf + used, cap - used, "]");
    return buf;
}

const char *mt_tensor_shape_str(const mt_tensor *tensor, char *buf, size_t cap) {
    if (!buf || !cap) return buf;
    if (!tensor) {
        snprintf(buf, cap, "(no tensor)");
        return buf;
    }
    return shape_str(tensor->ndim, tensor->shape, buf, cap);
}

/* Checks a shape given by a caller and computes its number of elements. */
static mt_status check_shape(const char *what, int ndim, const int64_t *shape, int64_t *numel) {
    if (ndim < 0 || ndim > MT_TENSOR_MAX_DIMS)
        return mt_error(MT_ERR_INVALID_ARG, "%s: %d dims asked, a tensor has 0 to %d", what, ndim,
                        MT_TENSOR_MAX_DIMS);
    if (ndim > 0 && !shape)
        return mt_error(MT_ERR_INVALID_ARG, "%s: shape is NULL for %d dims", what, ndim);
    int64_t n = 1;
    bool overflow = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            char s[160];
            return mt_error(MT_ERR_INVALID_ARG, "%s: shape %s has a negative size in dim %d", what,
                            shape_str(ndim, shape, s, sizeof s), i);
        }
        if (__builtin_mul_overflow(n, shape[i], &n)) overflow = true;
    }
    if (overflow) {
        char s[160];
        return mt_error(MT_ERR_INVALID_ARG, "%s: shape %s has too many elements to count", what,
                        shape_str(ndim, shape, s, sizeof s));
    }
    *numel = n;
    return MT_OK;
}

static void set_shape(mt_tensor *t, int ndim, const int64_t *shape, int64_t numel) {
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->numel = numel;
}

mt_status mt_tensor_create(mt_device *dev, mt_dtype dtype, int ndim, const int64_t *shape,
                           mt_mem_category category, mt_tensor **out) {
    if (!dev || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_tensor_create: dev and out must not be NULL");
    *out = NULL;
    size_t elem = mt_dtype_size(dtype);
    if (!elem)
        return mt_error(MT_ERR_INVALID_ARG, "mt_tensor_create: unknown dtype %d", (int)dtype);
    int64_t numel;
    MT_TRY(check_shape("mt_tensor_create", ndim, shape, &numel));
    size_t nbytes;
    char s[160];
    if ((uint64_t)numel > SIZE_MAX || __builtin_mul_overflow((size_t)numel, elem, &nbytes))
        return mt_error(MT_ERR_OUT_OF_MEMORY, "cannot create a %s tensor of shape %s on %s: its "
                                              "size does not fit in the address space",
                        mt_dtype_name(dtype), shape_str(ndim, shape, s, sizeof s),
                        mt_device_name(dev));

    mt_tensor *t = calloc(1, sizeof *t);
    mt_storage *storage = calloc(1, sizeof *storage);
    if (!t || !storage) {
        free(t);
        free(storage);
        return mt_error(MT_ERR_OUT_OF_MEMORY, "cannot allocate a tensor object");
    }
    mt_status st = mt_device_alloc(dev, nbytes, category, &storage->data);
    if (st != MT_OK) {
        free(t);
        free(storage);
        return mt_error_wrap(st, "cannot create a %s tensor of shape %s", mt_dtype_name(dtype),
                             shape_str(ndim, shape, s, sizeof s));
    }
    storage->dev = dev;
    storage->nbytes = nbytes;
    storage->category = category;
    atomic_init(&storage->refs, 1);
    t->storage = storage;
    t->dtype = dtype;
    set_shape(t, ndim, shape, numel);
    *out = t;
    return MT_OK;
}

mt_status mt_tensor_zeros(mt_device *dev, mt_dtype dtype, int ndim, const int64_t *shape,
                          mt_mem_category category, mt_tensor **out) {
    MT_TRY(mt_tensor_create(dev, dtype, ndim, shape, category, out));
    mt_status st = mt_device_memset(dev, (*out)->storage->data, 0, (*out)->storage->nbytes, NULL);
    if (st != MT_OK) {
        mt_tensor_free(*out);
        *out = NULL;
    }
    return st;
}

void mt_tensor_free(mt_tensor *tensor) {
    if (!tensor) return;
    mt_storage *storage = tensor->storage;
    if (atomic_fetch_sub(&storage->refs, 1) == 1) {
        mt_device_free(storage->dev, storage->data);
        free(storage);
    }
    free(tensor);
}

/* A new tensor sharing parent's storage, offset bytes further in. */
static mt_status make_view(mt_tensor *parent, size_t offset, int ndim, const int64_t *shape,
                           int64_t numel, mt_tensor **out) {
    mt_tensor *t = calloc(1, sizeof *t);
    if (!t) return mt_error(MT_ERR_OUT_OF_MEMORY, "cannot allocate a tensor view object");
    t->storage = parent->storage;
    atomic_fetch_add(&t->storage->refs, 1);
    t->offset = parent->offset + offset;
    t->dtype = parent->dtype;
    t->is_view = true;
    set_shape(t, ndim, shape, numel);
    *out = t;
    return MT_OK;
}

mt_status mt_tensor_narrow(mt_tensor *tensor, int64_t start, int64_t length, mt_tensor **out) {
    if (!tensor || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_tensor_narrow: tensor and out must not be NULL");
    *out = NULL;
    char s[160];
    if (tensor->ndim == 0)
        return mt_error(MT_ERR_INVALID_ARG, "mt_tensor_narrow: a scalar tensor has no dim 0");
    int64_t rows = tensor->shape[0];
    if (start < 0 || length < 0 || start > rows || length > rows - start)
        return mt_error(MT_ERR_INVALID_ARG,
                        "mt_tensor_narrow: start %lld, length %lld is outside dim 0 (size %lld) "
                        "of a tensor of shape %s", (long long)start, (long long)length,
                        (long long)rows, mt_tensor_shape_str(tensor, s, sizeof s));
    int64_t row_numel = 1;
    for (int i = 1; i < tensor->ndim; i++) row_numel *= tensor->shape[i];
    int64_t shape[MT_TENSOR_MAX_DIMS];
    for (int i = 0; i < tensor->ndim; i++) shape[i] = tensor->shape[i];
    shape[0] = length;
    /* Fits: start * row_numel is at most the parent's numel. */
    size_t offset = (size_t)(start * row_numel) * mt_dtype_size(tensor->dtype);
    return make_view(tensor, offset, tensor->ndim, shape, length * row_numel, out);
}

mt_status mt_tensor_reshape(mt_tensor *tensor, int ndim, const int64_t *shape, mt_tensor **out) {
    if (!tensor || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_tensor_reshape: tensor and out must not be NULL");
    *out = NULL;
    if (ndim < 0 || ndim > MT_TENSOR_MAX_DIMS || (ndim > 0 && !shape))
        return check_shape("mt_tensor_reshape", ndim, shape, &(int64_t){0});
    char from[160], to[160];
    int64_t resolved[MT_TENSOR_MAX_DIMS] = {0};
    int inferred = -1;
    for (int i = 0; i < ndim; i++) {
        resolved[i] = shape[i];
        if (shape[i] != -1) continue;
        if (inferred >= 0)
            return mt_error(MT_ERR_INVALID_ARG, "mt_tensor_reshape: shape %s has more than one -1",
                            shape_str(ndim, shape, to, sizeof to));
        inferred = i;
        resolved[i] = 1;
    }
    int64_t known;
    MT_TRY(check_shape("mt_tensor_reshape", ndim, resolved, &known));
    if (inferred >= 0) {
        if (known == 0 || tensor->numel % known != 0)
            return mt_error(MT_ERR_INVALID_ARG,
                            "mt_tensor_reshape: cannot reshape a tensor of shape %s (%lld "
                            "elements) into %s", mt_tensor_shape_str(tensor, from, sizeof from),
                            (long long)tensor->numel, shape_str(ndim, shape, to, sizeof to));
        resolved[inferred] = tensor->numel / known;
        known = tensor->numel;
    }
    if (known != tensor->numel)
        return mt_error(MT_ERR_INVALID_ARG,
                        "mt_tensor_reshape: cannot reshape a tensor of shape %s (%lld elements) "
                        "into %s (%lld elements)", mt_tensor_shape_str(tensor, from, sizeof from),
                        (long long)tensor->numel, shape_str(ndim, shape, to, sizeof to),
                        (long long)known);
    return make_view(tensor, 0, ndim, resolved, known, out);
}

mt_status mt_tensor_view(mt_tensor *tensor, int64_t offset, int ndim, const int64_t *shape,
                         mt_tensor **out) {
    if (!tensor || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_tensor_view: tensor and out must not be NULL");
    *out = NULL;
    int64_t numel;
    MT_TRY(check_shape("mt_tensor_view", ndim, shape, &numel));
    if (offset < 0 || offset > tensor->numel || numel > tensor->numel - offset) {
        char from[160], to[160];
        return mt_error(MT_ERR_INVALID_ARG,
                        "mt_tensor_view: a view of shape %s (%lld elements) at element offset "
                        "%lld does not fit in a tensor of shape %s (%lld elements)",
                        shape_str(ndim, shape, to, sizeof to), (long long)numel,
                        (long long)offset, mt_tensor_shape_str(tensor, from, sizeof from),
                        (long long)tensor->numel);
    }
    size_t bytes = (size_t)offset * mt_dtype_size(tensor->dtype);
    return make_view(tensor, bytes, ndim, shape, numel, out);
}

void *mt_tensor_data(const mt_tensor *tensor) {
    return tensor ? (char *)tensor->storage->data + tensor->offset : NULL;
}

mt_dtype mt_tensor_dtype(const mt_tensor *tensor) {
    return tensor ? tensor->dtype : MT_DTYPE_COUNT;
}

int mt_tensor_ndim(const mt_tensor *tensor) { return tensor ? tensor->ndim : -1; }

int64_t mt_tensor_dim(const mt_tensor *tensor, int i) {
    if (!tensor) return -1;
    if (i < 0) i += tensor->ndim;
    if (i < 0 || i >= tensor->ndim) return -1;
    return tensor->shape[i];
}

int64_t mt_tensor_numel(const mt_tensor *tensor) { return tensor ? tensor->numel : 0; }

size_t mt_tensor_nbytes(const mt_tensor *tensor) {
    return tensor ? (size_t)tensor->numel * mt_dtype_size(tensor->dtype) : 0;
}

mt_device *mt_tensor_device(const mt_tensor *tensor) {
    return tensor ? tensor->storage->dev : NULL;
}

mt_mem_category mt_tensor_category(const mt_tensor *tensor) {
    return tensor ? tensor->storage->category : MT_MEM_OTHER;
}

bool mt_tensor_is_view(const mt_tensor *tensor) { return tensor && tensor->is_view; }
