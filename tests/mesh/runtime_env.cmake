# The launch-environment parser (mesh/runtime_env.c).
mt_add_unit_test(test_runtime_env SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_runtime_env.c
                 TIMEOUT 30)
# Where a job's store and UCX listen (mesh/netif.c).
mt_add_unit_test(test_netif SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_netif.c TIMEOUT 30)
