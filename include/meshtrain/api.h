/* MT_API marks what libmeshtrain exports. The library is built with hidden visibility, so a
 * function is part of the shared library's interface only when its public declaration carries
 * MT_API; everything else stays internal to the library. The arch_exports and install tests
 * compare the exported symbols with the declarations in these headers. */
#ifndef MESHTRAIN_API_H
#define MESHTRAIN_API_H

#if defined(__GNUC__) || defined(__clang__)
#define MT_API __attribute__((visibility("default")))
#else
#define MT_API
#endif

#endif
