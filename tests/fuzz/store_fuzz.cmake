# The server's frame parser under mutated input (a fixed-seed driver; the same file builds as a
# libFuzzer target, see its header).
mt_add_unit_test(fuzz_store_frame SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_store_frame.c
                 TIMEOUT 60 LABELS fuzz)
