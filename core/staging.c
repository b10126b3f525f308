/* Staging host buffers (core/staging.h). */
#include "core/staging.h"

#include "core/device_internal.h"
#include "core/error.h"
#include "core/host_alloc.h"

#include <meshtrain/memory.h>

#include <errno.h>
#include <stdlib.h>

mt_status mt_staging_alloc(mt_device *dev, size_t bytes, void **out) {
    if (!dev || !out)
        return mt_error(MT_ERR_INVALID_ARG, "mt_staging_alloc: dev and out must not be NULL");
    *out = NULL;
    if (dev->ops->staging_alloc) return dev->ops->staging_alloc(bytes, out);
    /* Page-aligned: a checkpoint writes its data file from here with O_DIRECT
     * (checkpoint/ckpt_fs.h). */
    *out = mt_host_alloc(bytes ? bytes : 1, 4096);
    if (*out) return MT_OK;
    char asked[32];
    return mt_error_errno(MT_ERR_OUT_OF_MEMORY, errno, "cannot allocate %s of host memory for "
                          "staging", mt_format_bytes(bytes, asked, sizeof asked));
}

void mt_staging_free(mt_device *dev, void *ptr) {
    if (!ptr || !dev) return;
    if (dev->ops->staging_free) dev->ops->staging_free(ptr);
    else free(ptr);
}
