# topo: binding plans (topo/bind.c) over the fixture topologies and small built models.
mt_add_unit_test(test_topo_bind SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_topo_bind.c TIMEOUT 60
                 LABELS topo)
target_compile_definitions(test_topo_bind PRIVATE
                           MT_TOPO_FIXTURES="${CMAKE_SOURCE_DIR}/tests/fixtures/topologies")
