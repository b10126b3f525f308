# The public ops' argument checks and their dispatch on the device kind (core/ops.c).
mt_add_unit_test(test_ops_dispatch SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_dispatch.c TIMEOUT 30
                 LABELS core)
mt_add_unit_test(test_ops_cast SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_cast.c TIMEOUT 60 LABELS core)
# The bf16 matrix products (core/cpu/ops_bf16.c) against the f32 ops on pre-rounded operands.
mt_add_unit_test(test_ops_bf16 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_bf16.c TIMEOUT 60
                 LABELS core)
