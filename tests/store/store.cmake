# The rendezvous store (store/*.c).
mt_add_unit_test(test_store SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store.c TIMEOUT 60)
# Its security and bounds: tokens, strangers, the pre-auth frame limit, client and byte caps.
mt_add_unit_test(test_store_auth SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store_auth.c TIMEOUT 60)
