# topo: nvidia-smi style classification, NVLink islands and TP groups over the fixture topologies.
mt_add_unit_test(test_topo_classify SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_topo_classify.c
                 TIMEOUT 60 LABELS topo)
target_compile_definitions(test_topo_classify PRIVATE
                           MT_TOPO_FIXTURES="${CMAKE_SOURCE_DIR}/tests/fixtures/topologies")
