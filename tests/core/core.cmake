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
