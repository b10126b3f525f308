/* MT_TOPO_FILE replaces discovery entirely: a file describes another machine, and mixing it with
 * what this host shows would give a model of neither. */
#include "topo/topo_open.h"

#include "core/error.h"

#include <stdlib.h>

#if defined(__SANITIZE_ADDRESS__)
#define MT_TOPO_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MT_TOPO_LSAN 1
#endif
#endif
#ifdef MT_TOPO_LSAN
#include <sanitizer/lsan_interface.h>
#endif

const char *mt_topo_file_env(void) {
    const char *path = getenv("MT_TOPO_FILE");
    return path && *path ? path : NULL;
}

/* hwloc's PCI plugin (libpciaccess) leaks a little at every discovery and is unloaded before the
 * process exits, so no suppression can name its frames; every program that discovers (mtrun at
 * each launch, a rank asking for its topology) would fail under LeakSanitizer. Only this
 * thread's allocations during the call are exempted; the model itself is freed as usual. */
static mt_status discover(mt_topo **out) {
#ifdef MT_TOPO_LSAN
    __lsan_disable();
#endif
    mt_status s = mt_topo_discover(out);
#ifdef MT_TOPO_LSAN
    __lsan_enable();
#endif
    return s;
}

mt_status mt_topo_open(mt_topo **out) {
    if (!out) return mt_error(MT_ERR_INVALID_ARG, "mt_topo_open: out must not be NULL");
    *out = NULL;
    const char *path = mt_topo_file_env();
    if (!path) return discover(out);
    mt_status s = mt_topo_load_file(path, out);
    if (s != MT_OK) return mt_error_wrap(s, "MT_TOPO_FILE=%s cannot be used", path);
    return MT_OK;
}
