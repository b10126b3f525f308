# topo: loading topology files (hwloc XML, NCCL topology XML) from tests/fixtures/topologies/.
mt_add_unit_test(test_topo_load SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_topo_load.c TIMEOUT 60
                 LABELS topo)
target_compile_definitions(test_topo_load PRIVATE
                           MT_TOPO_FIXTURES="${CMAKE_SOURCE_DIR}/tests/fixtures/topologies")
