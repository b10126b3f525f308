# Short fixed-seed runs of the topology loader fuzz harnesses over the fixture files (the same
# files build as libFuzzer targets, see their headers). Warnings on odd-but-accepted input are
# expected, so only errors are logged; hwloc's own leaks on rejected files are suppressed (matters
# under -DMT_SANITIZE=ON).
foreach(fuzz_topo fuzz_topo_nccl fuzz_topo_hwloc)
  mt_add_unit_test(${fuzz_topo} SOURCES ${CMAKE_CURRENT_LIST_DIR}/${fuzz_topo}.c
                   TIMEOUT 120 LABELS topo fuzz ENV MT_LOG_LEVEL=error HWLOC_HIDE_ERRORS=2
                   LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_LIST_DIR}/topo_lsan.supp)
  target_compile_definitions(${fuzz_topo} PRIVATE
                             MT_TOPO_FIXTURES="${CMAKE_SOURCE_DIR}/tests/fixtures/topologies")
endforeach()
# What the hwloc harness found, kept as a plain test.
mt_add_unit_test(test_topo_hwloc_libxml SOURCES ${CMAKE_SOURCE_DIR}/tests/topo/test_topo_hwloc_libxml.c
                 TIMEOUT 30 LABELS topo ENV HWLOC_HIDE_ERRORS=2
                 LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_LIST_DIR}/topo_lsan.supp)
target_compile_definitions(test_topo_hwloc_libxml PRIVATE
                           MT_TOPO_FIXTURES="${CMAKE_SOURCE_DIR}/tests/fixtures/topologies")
target_link_libraries(test_topo_hwloc_libxml PRIVATE ${CMAKE_DL_LIBS})
