/* meshtrain's version. The store handshake refuses clients of another version. */
#ifndef MESHTRAIN_VERSION_H
#define MESHTRAIN_VERSION_H

#include <meshtrain/api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MT_VERSION_MAJOR 0
#define MT_VERSION_MINOR 4
#define MT_VERSION_PATCH 0

/* "MAJOR.MINOR.PATCH" of the library linked at run time. */
MT_API const char *mt_version(void);

#ifdef __cplusplus
}
#endif
#endif
