/* Tensors: a dtype, up to MT_TENSOR_MAX_DIMS dims and contiguous row-major storage on a device,
 * charged to a memory category.
 *
 * Views (narrow, reshape, flat view) share their parent's storage, which is reference-counted:
 * it is freed when the last tensor using it is freed, so a view stays valid after its parent is
 * freed. Every tensor, view or not, is freed with mt_tensor_free. A tensor is not thread-safe;
 * distinct tensors sharing storage may be freed from different threads.
 */
#ifndef MESHTRAIN_TENSOR_H
#define MESHTRAIN_TENSOR_H

#include <meshtrain/api.h>
#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/memory.h>
#include <meshtrain/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MT_TENSOR_MAX_DIMS 8

typedef struct mt_tensor mt_tensor;

/* Allocates an uninitialised tensor of the given shape (ndim 0 is a scalar; dims may be 0) on
 * dev, charged to category. Fails with MT_ERR_OUT_OF_MEMORY like mt_device_alloc. */
MT_API mt_status mt_tensor_create(mt_device *dev, mt_dtype dtype, int ndim, const int64_t *shape,
                                  mt_mem_category category, mt_tensor **out);

/* Like mt_tensor_create, with every byte set to zero. */
MT_API mt_status mt_tensor_zeros(mt_device *dev, mt_dtype dtype, int ndim, const int64_t *shape,
                                 mt_mem_category category, mt_tensor **out);

/* Frees a tensor or view (NULL is ignored); the storage goes when its last user does. */
MT_API void mt_tensor_free(mt_tensor *tensor);

/* A view of rows [start, start + length) along dim 0; the other dims are kept. */
MT_API
MT_API
mt_status mt_tensor_narrow(mt_tensor *tensor, int64_t start, int64_t length, mt_tensor **out);

/* A view with a new shape and the same number of elements; at most one dim may be -1, inferred
 * from the others. */
MT_API
MT_API
mt_status mt_tensor_reshape(mt_tensor *tensor, int ndim, const int64_t *shape, mt_tensor **out);

/* A view of numel(shape) elements starting offset elements into tensor's (flat) data. */
MT_API mt_status mt_tensor_view(mt_tensor *tensor, int64_t offset, int ndim, const int64_t *shape,
                                mt_tensor **out);

/* Pointer to the first element (device memory on a GPU). */
MT_API void *mt_tensor_data(const mt_tensor *tensor);
MT_API mt_dtype mt_tensor_dtype(const mt_tensor *tensor);
MT_API int mt_tensor_ndim(const mt_tensor *tensor);
/* Size of dim i; negative i counts from the end (-1 is the last); -1 when out of range. */
MT_API int64_t mt_tensor_dim(const mt_tensor *tensor, int i);
/* Number of elements (1 for a scalar) and their size in bytes. */
MT_API int64_t mt_tensor_numel(const mt_tensor *tensor);
MT_API size_t mt_tensor_nbytes(const mt_tensor *tensor);
MT_API mt_device *mt_tensor_device(const mt_tensor *tensor);
/* The category the storage is charged to. */
MT_API mt_mem_category mt_tensor_category(const mt_tensor *tensor);
/* True when the tensor was made by narrow, reshape or view. */
MT_API bool mt_tensor_is_view(const mt_tensor *tensor);

/* Writes the shape as "[2, 3, 4]" into buf (for messages); returns buf. */
MT_API const char *mt_tensor_shape_str(const mt_tensor *tensor, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
