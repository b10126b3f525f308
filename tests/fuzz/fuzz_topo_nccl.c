/* Fuzzes the NCCL topology XML loader (topo/topo_nccl_xml.c), which reads files users and other
 * machines wrote.
 *
 * Property: no input crashes, leaks or reads out of bounds (ASan+UBSan); a rejected input sets an
 * error message; an accepted one is a model readers can walk (indices in range, PCI parents
 * acyclic, GPU indices unique and sorted, NVLink counts bounded).
 *
 * With libFuzzer (clang), from the repository root after a build in build-live/ (any build dir):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -DMT_FUZZ_LIBFUZZER -D_GNU_SOURCE -I. \
 *     -Iinclude $(pkg-config --cflags libxml-2.0 hwloc) tests/fuzz/fuzz_topo_nccl.c \
 *     topo/topology.c topo/topo_xml.c topo/topo_nccl_xml.c topo/topo_hwloc.c core/status.c \
 *     core/log.c $(pkg-config --libs libxml-2.0 hwloc) -o /tmp/fuzz_topo_nccl
 *   mkdir -p /tmp/corpus_nccl && cp tests/fixtures/topologies/nccl-* /tmp/corpus_nccl/
 *   /tmp/fuzz_topo_nccl -max_total_time=600 -max_len=65536 -dict=tests/fuzz/topo_xml.dict \
 *     /tmp/corpus_nccl
 * Without it (ctest), a built-in driver mutates the nccl-* fixtures with a fixed seed:
 *   fuzz_topo_nccl [iterations] [fixture dir]
 */
#define FUZZ_NAME "fuzz_topo_nccl"
#define FUZZ_PREFIX "nccl-"
#define FUZZ_DEFAULT_ITERATIONS 150000

#include "fuzz_topo_common.h"

static mt_status fuzz_load(const char *path, const char *buf, size_t len, mt_topo **out) {
    return mt_topo_load_nccl_xml(path, buf, len, out);
}
