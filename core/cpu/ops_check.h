/* Internal: the argument checks every CPU op starts with (core/cpu/ops_*.c). */
#ifndef MT_CORE_CPU_OPS_CHECK_H
#define MT_CORE_CPU_OPS_CHECK_H

#include "core/error.h"

#include <meshtrain/device.h>

/* A CUDA device is refused until it has its own kernels: running these loops on device pointers
 * would crash, not compute. */
static inline mt_status check_device(mt_device *dev, const char *op) {
    if (!dev) return mt_error(MT_ERR_INVALID_ARG, "%s: the device is NULL", op);
    if (mt_device_get_kind(dev) != MT_DEVICE_CPU)
        return mt_error(MT_ERR_UNSUPPORTED,
                        "%s: no implementation for device %s yet (only the CPU device computes)",
                        op, mt_device_name(dev));
    return MT_OK;
}

/* A NULL buffer is only acceptable when it would hold no element. */
static inline mt_status check_ptr(const void *p, size_t elems, const char *op, const char *what) {
    if (!p && elems > 0) return mt_error(MT_ERR_INVALID_ARG, "%s: %s is NULL", op, what);
    return MT_OK;
}

#endif
