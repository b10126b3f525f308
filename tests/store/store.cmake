# The rendezvous store (store/*.c).
mt_add_unit_test(test_store SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store.c TIMEOUT 60)
mt_add_unit_test(test_store_liveness SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store_liveness.c
                 TIMEOUT 60)
