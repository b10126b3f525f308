# mesh: local rank -> GPU placement from topology files, expected mappings checked in.
mt_add_unit_test(test_mesh_placement SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_mesh_placement.c
                 TIMEOUT 60 LABELS mesh ENV MT_LOG_LEVEL=error)
target_compile_definitions(test_mesh_placement PRIVATE
                           MT_TOPO_FIXTURES="${CMAKE_SOURCE_DIR}/tests/fixtures/topologies")
