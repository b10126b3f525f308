# CPU compute ops and AdamW math (core/cpu/ops_cpu.c): no runtime, no engine.
mt_add_unit_test(test_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops.c TIMEOUT 60 LABELS core)

# The reductions of gradient clipping (core/cpu/ops_reduce.c): sum of squares into one double,
# scale; the CUDA versions are compared with these in tests/gpu/test_gpu_reduce_ops.c.
mt_add_unit_test(test_ops_reduce SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_reduce.c TIMEOUT 60
                 LABELS core)
