# The rendezvous store (store/*.c).
mt_add_unit_test(test_store SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store.c TIMEOUT 60)
mt_add_unit_test(test_store_liveness SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store_liveness.c
                 TIMEOUT 60)
mt_add_test_program(prog_store_connect_share ${CMAKE_CURRENT_LIST_DIR}/prog_store_connect_share.c)
add_test(NAME store_connect_share
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/store_connect_share.sh
                 $<TARGET_FILE:prog_store_connect_share>)
set_tests_properties(store_connect_share PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77 LABELS unit)
# Its security and bounds: tokens, strangers, the pre-auth frame limit, client and byte caps.
mt_add_unit_test(test_store_auth SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store_auth.c TIMEOUT 60)
