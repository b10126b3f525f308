/* Fuzzes the hwloc XML loader (topo/topo_hwloc.c): hwloc's own XML import and, on whatever it
 * accepts, our walk over packages, NUMA nodes, the PCI tree, GPUs, NICs, NVSwitches and the
 * NVLinkBandwidth distances.
 *
 * Property: no input crashes, leaks or reads out of bounds (ASan+UBSan); a rejected input sets an
 * error message; an accepted one is a model readers can walk (indices in range, PCI parents
 * acyclic, GPU indices unique and sorted).
 *
 * With libFuzzer (clang, ASan+UBSan), for as long as you like (docs/fuzzing.md):
 *   scripts/fuzz 600 fuzz_topo_hwloc
 * Without it (ctest), a built-in driver mutates the hwloc-* fixtures with a fixed seed:
 *   fuzz_topo_hwloc [iterations] [fixture dir]
 */
#define FUZZ_NAME "fuzz_topo_hwloc"
#define FUZZ_PREFIX "hwloc-"
#define FUZZ_DEFAULT_ITERATIONS 10000

#include "fuzz_topo_common.h"

static mt_status fuzz_load(const char *path, const char *buf, size_t len, mt_topo **out) {
    return mt_topo_load_hwloc_xml(path, buf, len, out);
}
