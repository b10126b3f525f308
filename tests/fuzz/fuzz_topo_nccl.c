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

#include "fuzz_topo_common.h"

static mt_status fuzz_load(const char *path, const char *buf, size_t len, mt_topo **out) {
    return mt_topo_load_nccl_xml(path, buf, len, out);
}
