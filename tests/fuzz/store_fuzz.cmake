# The server's frame parser under mutated input (a fixed-seed driver; the same file builds as a
# libFuzzer target, see its header).
mt_add_unit_test(fuzz_store_frame SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_store_frame.c
                 TIMEOUT 60 LABELS fuzz)
# The server's state machine (handshake, limits, every request, waits and their deadlines) under
# random sequences of client actions over socketpairs (a fixed-seed driver that first replays what
# fuzzing found, tests/fuzz/store_server_inputs; the same file builds as a libFuzzer target, see its
# header).
mt_add_unit_test(fuzz_store_server SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_store_server.c
                 TIMEOUT 120 LABELS fuzz store ENV MT_LOG_LEVEL=error)
target_compile_definitions(fuzz_store_server PRIVATE
                           MT_STORE_SERVER_INPUTS="${CMAKE_CURRENT_LIST_DIR}/store_server_inputs")
