# mt-topo: reports and the NCCL export through the library (test_topo_report), and the tool as a
# user runs it: expected reports of every fixture, this machine's live report, bad input.
# The shell tests use python3 to check the JSON reports.
mt_add_unit_test(test_topo_report SOURCES ${CMAKE_SOURCE_DIR}/tests/topo/test_topo_report.c
                 TIMEOUT 120 LABELS topo)
target_compile_definitions(test_topo_report PRIVATE
                           MT_TOPO_FIXTURES="${CMAKE_SOURCE_DIR}/tests/fixtures/topologies")
add_test(NAME mt_topo_expected
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/check_expected.sh $<TARGET_FILE:mt-topo>
                 ${CMAKE_SOURCE_DIR}/tests/fixtures/topologies)
add_test(NAME mt_topo_cli COMMAND ${CMAKE_CURRENT_LIST_DIR}/mt_topo_cli.sh $<TARGET_FILE:mt-topo>
                                  ${CMAKE_SOURCE_DIR}/tests/fixtures/topologies)
set_tests_properties(mt_topo_expected mt_topo_cli PROPERTIES TIMEOUT 120 LABELS "topo;tools"
                     ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
