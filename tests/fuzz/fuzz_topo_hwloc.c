/* Fuzzes the hwloc XML loader (topo/topo_hwloc.c): hwloc's own XML import and, on whatever it
 * accepts, our walk over packages, NUMA nodes, the PCI tree, GPUs, NICs, NVSwitches and the
 * NVLinkBandwidth distances.
 *
 * Property: no input crashes, leaks or reads out of bounds (ASan+UBSan); a rejected input sets an
 * error message; an accepted one is a model readers can walk (indices in range, PCI parents
 * acyclic, GPU indices unique and sorted).
 *
 * With libFuzzer (clang), from the repository root:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -DMT_FUZZ_LIBFUZZER -D_GNU_SOURCE -I. \
 *     -Iinclude $(pkg-config --cflags libxml-2.0 hwloc) tests/fuzz/fuzz_topo_hwloc.c \
 *     topo/topology.c topo/topo_xml.c topo/topo_nccl_xml.c topo/topo_hwloc.c core/status.c \
 *     core/log.c $(pkg-config --libs libxml-2.0 hwloc) -o /tmp/fuzz_topo_hwloc
 *   mkdir -p /tmp/corpus_hwloc && cp tests/fixtures/topologies/hwloc-* /tmp/corpus_hwloc/
 *   LSAN_OPTIONS=suppressions=tests/fuzz/topo_lsan.supp HWLOC_HIDE_ERRORS=2 \
 *   /tmp/fuzz_topo_hwloc -max_total_time=600 -max_len=131072 -dict=tests/fuzz/topo_xml.dict \
 *     /tmp/corpus_hwloc
 * (topo_lsan.supp silences leaks inside hwloc's own XML import on rejected files; hwloc itself
 * is not instrumented, so coverage guidance stops at its API; the inputs it
 * accepts still exercise all of our walk.)
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
