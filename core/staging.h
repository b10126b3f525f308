/* Internal: host buffers for staging device data (a checkpoint's shards on their way to disk):
 * page-locked on a GPU, so that device-to-host copies run at full speed, ordinary host memory
 * (huge-page aligned from 2 MiB, core/host_alloc.h) on the CPU device; page-aligned either way,
 * for O_DIRECT. Not charged to the device's accounting: it is host memory. */
#ifndef MT_CORE_STAGING_H
#define MT_CORE_STAGING_H

#include <meshtrain/device.h>
#include <meshtrain/status.h>

#include <stddef.h>

mt_status mt_staging_alloc(mt_device *dev, size_t bytes, void **out);
/* Frees a buffer of mt_staging_alloc for the same device (NULL is ignored). */
void mt_staging_free(mt_device *dev, void *ptr);

#endif
