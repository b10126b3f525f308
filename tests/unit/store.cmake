# The rendezvous store (store/*.c) and the launch-environment parser (mesh/runtime_env.c).
mt_add_unit_test(test_store SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store.c TIMEOUT 60)
mt_add_unit_test(test_runtime_env SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_runtime_env.c
                 TIMEOUT 30)
# The server's frame parser under mutated input (a fixed-seed driver; the same file builds as a
# libFuzzer target, see its header).
mt_add_unit_test(fuzz_store_frame SOURCES ${CMAKE_CURRENT_LIST_DIR}/../fuzz/fuzz_store_frame.c
                 TIMEOUT 60 LABELS fuzz)
