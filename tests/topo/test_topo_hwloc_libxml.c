/* Regression: hwloc's libxml2 plugin installs libxml2's generic error handler and is unloaded by
 * hwloc_topology_destroy; the next libxml2 error then jumped into unmapped code (found by
 * fuzz_topo_hwloc). After loading an hwloc XML file, the handler must live in mapped code, and
 * a later malformed file must fail cleanly. */
#include "check.h"
#include "topo/topology.h"

#include <dlfcn.h>
#include <libxml/globals.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = '\0';
        *len = (size_t)n;
    } else {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

int main(void) {
    size_t len = 0;
    char *buf = slurp(MT_TOPO_FIXTURES "/hwloc-aws-g5.48xl-nixl.xml", &len);
    CHECK(buf != NULL);
    if (!buf) return check_report("test_topo_hwloc_libxml");
    for (int round = 0; round < 2; round++) {
        mt_topo *t = NULL;
        CHECK_OK(mt_topo_load_hwloc_xml("g5.xml", buf, len, &t));
        mt_topo_destroy(t);
        Dl_info info;
        void *handler = *(void **)&xmlGenericError;
        CHECK_MSG(handler == NULL || dladdr(handler, &info) != 0,
                  "libxml2's error handler %p points into unloaded code", handler);
        static const char bad[] = "<topology version=\"2.0\"><object type=\"Machine\"></topology>";
        CHECK(mt_topo_load_hwloc_xml("bad.xml", bad, sizeof(bad) - 1, &t) != MT_OK && !t);
    }
    free(buf);
    return check_report("test_topo_hwloc_libxml");
}
