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

  # Both op tests with a second CPU device in the GPU's place (MT_TEST_OPS_SELF=1): their own
  # bookkeeping (uploads, comparisons, frees) checked on every machine, GPU or not.
  foreach(t test_gpu_ops test_gpu_reduce_ops)
    add_test(NAME ${t}_self COMMAND ${t})
    set_tests_properties(${t}_self PROPERTIES TIMEOUT 120 LABELS "unit;cuda"
                         ENVIRONMENT "MT_TEST_OPS_SELF=1")
  endforeach()
endif()

# Collectives on GPU buffers through the mesh group's NCCL communicator, under mtrun: one rank,
# and two ranks (on a single-GPU machine they share it: NCCL >= 2.30 with
# NCCL_MULTI_RANK_GPU_ENABLE=1, which tests/gpu/run.sh provides; otherwise run it on two GPUs).
# The timeout check: one rank skips an all-reduce, the other must time out after MT_TIMEOUT_S
# naming the operation and the group.
if(MT_HAVE_NCCL)
  mt_add_test_program(test_gpu_nccl ${CMAKE_CURRENT_LIST_DIR}/test_gpu_nccl.c)
  set(MT_GPU_MTRUN ${CMAKE_BINARY_DIR}/bin/mtrun)
  mt_add_mp_test(gpu_nccl_np1 TIMEOUT 300 LABELS gpu
    COMMAND ${MT_GPU_MTRUN} --standalone --nproc_per_node 1 ${MT_TEST_BIN}/test_gpu_nccl)
  mt_add_mp_test(gpu_nccl_np2 TIMEOUT 300 LABELS gpu ENV NCCL_MULTI_RANK_GPU_ENABLE=1
    COMMAND ${MT_GPU_MTRUN} --standalone --nproc_per_node 2 ${MT_TEST_BIN}/test_gpu_nccl
            --bench-mib 256)
  mt_add_mp_test(gpu_nccl_timeout_np2 TIMEOUT 120 LABELS gpu ENV NCCL_MULTI_RANK_GPU_ENABLE=1
    COMMAND ${MT_GPU_MTRUN} --standalone --nproc_per_node 2 ${MT_TEST_BIN}/test_gpu_nccl
            --timeout-check)
  set_tests_properties(gpu_nccl_np1 gpu_nccl_np2 gpu_nccl_timeout_np2 PROPERTIES
                       SKIP_RETURN_CODE 77)
endif()

# The comparison tests/gpu/run.sh makes between mt-topo and nvidia-smi / NCCL's own topology dump,
# checked on a fixture (runs anywhere: no GPU involved).
add_test(NAME compare_topo_script
  COMMAND ${CMAKE_CURRENT_LIST_DIR}/compare_topo_test.sh ${CMAKE_BINARY_DIR}/bin/mt-topo
          ${CMAKE_SOURCE_DIR}/tests/fixtures/topologies/nccl-azure-ndv4-a100x8-topo.xml)
set_tests_properties(compare_topo_script PROPERTIES TIMEOUT 60 LABELS "tools;topo")

# Offload staging between the pinned host tier and GPU memory (UCX with CUDA, or cudaMemcpyAsync).
if(MT_HAVE_CUDA)
  mt_add_unit_test(test_gpu_stage SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_stage.c TIMEOUT 120
                   LABELS gpu)
  set_tests_properties(test_gpu_stage PROPERTIES SKIP_RETURN_CODE 77)
  # Built against a UCX with CUDA transports (cmake/ucx.cmake): the stager must then take the
  # UCX path on the GPU, not fall back to cudaMemcpyAsync unnoticed.
  if(MT_UCX_HAS_CUDA)
    target_compile_definitions(test_gpu_stage PRIVATE MT_TEST_EXPECT_UCX_PATH=1)
  endif()
endif()
