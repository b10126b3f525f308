/* Fuzzes the NCCL topology XML loader (topo/topo_nccl_xml.c), which reads files users and other
 * machines wrote.
 *
 * Property: no input crashes, leaks or reads out of bounds (ASan+UBSan); a rejected input sets an
 * error message; an accepted one is a model readers can walk (indices in range, PCI parents
 * acyclic, GPU indices unique and sorted, NVLink counts bounded).
 *
 * With libFuzzer (clang, ASan+UBSan), for as long as you like (docs/fuzzing.md):
 *   scripts/fuzz 600 fuzz_topo_nccl
 * Without it (ctest), a built-in driver mutates the nccl-* fixtures with a fixed seed:
 *   fuzz_topo_nccl [iterations] [fixture dir]
 */
#define FUZZ_NAME "fuzz_topo_nccl"
#define FUZZ_PREFIX "nccl-"
#define FUZZ_DEFAULT_ITERATIONS 150000
#ifndef MT_FUZZ_LIBFUZZER
#define FUZZ_EXTRA_SEEDS
#endif

#include "fuzz_topo_common.h"

#include "topo/report.h"

static mt_status fuzz_load(const char *path, const char *buf, size_t len, mt_topo **out) {
    return mt_topo_load_nccl_xml(path, buf, len, out);
}

#ifdef FUZZ_EXTRA_SEEDS
/* NCCL's own files (the nccl-* fixtures) carry none of the mt_* attributes mt-topo's export adds
 * (packages, cores, PUs, host bridges, link rates, NVLink unknown), so the exports of two hwloc
 * fixtures that have all of them are seeds as well; each must load back like any seed. */
static int fuzz_extra_seeds(const char *dir, fuzz_seed *seeds, int n) {
    static const char *const from[] = {"hwloc-ibm-power8-minsky-4xP100-nvlink.v2.xml",
                                       "hwloc-aws-p4d.24xl-nixl.xml"};
    for (size_t i = 0; i < sizeof from / sizeof *from; i++) {
        if (n >= FUZZ_MAX_SEEDS) break;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, from[i]);
        mt_topo *t = NULL;
        char *buf = NULL;
        size_t len = 0;
        FILE *mem = NULL;
        mt_status s = mt_topo_load_file(path, &t);
        if (s == MT_OK) mem = open_memstream(&buf, &len);
        if (s == MT_OK && !mem) s = MT_ERR_OUT_OF_MEMORY;
        if (s == MT_OK) s = mt_topo_export_nccl(t, mem);
        if (mem) fclose(mem);
        mt_topo_destroy(t);
        if (s != MT_OK || !len) {
            fprintf(stderr, "%s: no NCCL export of %s to seed with: %s\n", FUZZ_NAME, path,
                    s != MT_OK ? mt_last_error() : "empty");
            free(buf);
            return -1;
        }
        seeds[n].data = (uint8_t *)buf;
        seeds[n].len = len;
        n++;
    }
    return n;
}
#endif
