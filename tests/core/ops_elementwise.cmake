# The elementwise ops for model authors (core/cpu/ops_elementwise.c and relu): activations against
# double references and finite differences, the product, argument errors, the compute stream; the
# CUDA versions are compared with these in tests/gpu/test_gpu_ops.c.
mt_add_unit_test(test_ops_elementwise SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_elementwise.c
                 TIMEOUT 60 LABELS core)
