# core: dtypes, memory accounting, devices. allocator_may_return_null lets the
# sanitizer build return NULL for the impossible allocations the device test asks for.
mt_add_unit_test(test_dtype SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dtype.c TIMEOUT 60 LABELS core)
mt_add_unit_test(test_memory SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_memory.c TIMEOUT 60
                 LABELS core)
mt_add_unit_test(test_device SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_device.c TIMEOUT 120
                 LABELS core ENV ASAN_OPTIONS=allocator_may_return_null=1)
mt_add_unit_test(test_host_memory SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_host_memory.c
                 TIMEOUT 60 LABELS core)
mt_add_unit_test(test_device_cache SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_device_cache.c
                 TIMEOUT 60 LABELS core)
# The per-rank thread pool: every index once on 1, 2, 3 and 7 threads, chunk boundaries and a
# chunk-ordered reduction independent of the thread count, two callers on one pool, the sizing
# environment and its errors.
mt_add_unit_test(test_thread_pool SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_thread_pool.c
                 TIMEOUT 60 LABELS core)
# The host AdamW: every instruction-set path of this CPU on 1, 2, 3 and 7 threads bit for bit
# against mt_op_adamw's historical scalar loop, the device op under MT_ADAMW_ISA, its errors.
mt_add_unit_test(test_host_adamw SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_host_adamw.c
                 TIMEOUT 120 LABELS core)
