# GPU tests (issue 7): registered only in a CUDA build. Tests labelled `gpu` need a GPU and exit
# 77 without one, which ctest reports as skipped (not passed); tests/gpu/run.sh runs them all on
# a GPU machine. test_block_cache checks the caching allocator's bookkeeping and runs anywhere.
if(MT_HAVE_CUDA)
  mt_add_unit_test(test_block_cache SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_block_cache.c
                   TIMEOUT 60 LABELS "core;cuda")

  mt_add_unit_test(test_gpu_device SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_device.c
                   TIMEOUT 120 LABELS gpu)
  set_tests_properties(test_gpu_device PROPERTIES SKIP_RETURN_CODE 77)
  # The same checks with caching off: every free goes straight to cudaFree.
  add_test(NAME test_gpu_device_nocache COMMAND test_gpu_device)
  set_tests_properties(test_gpu_device_nocache PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120
                       LABELS "unit;gpu" ENVIRONMENT "MT_CUDA_CACHE_BYTES=0")

  # Every op on the GPU against the CPU implementation, random inputs.
  mt_add_unit_test(test_gpu_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_ops.c TIMEOUT 120
                   LABELS gpu)
  set_tests_properties(test_gpu_ops PROPERTIES SKIP_RETURN_CODE 77)
endif()

# The reductions of gradient clipping (sum of squares into a device double, scale) on the GPU
# against the CPU, up to more than 2^31 elements.
if(MT_HAVE_CUDA)
  mt_add_unit_test(test_gpu_reduce_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_reduce_ops.c
                   TIMEOUT 300 LABELS gpu)
  set_tests_properties(test_gpu_reduce_ops PROPERTIES SKIP_RETURN_CODE 77)
endif()
