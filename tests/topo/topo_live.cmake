# topo: live discovery of the machine running the tests through hwloc. Leak detection is off for
# this one test: hwloc's PCI plugin (libpciaccess) leaks at discovery and is unloaded before exit,
# so its frames cannot be named in a suppression. The same walk over the same objects runs under
# LeakSanitizer in fuzz_topo_hwloc.
mt_add_unit_test(test_topo_live SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_topo_live.c TIMEOUT 60
                 LABELS topo ENV ASAN_OPTIONS=detect_leaks=0)
