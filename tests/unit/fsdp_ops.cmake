# CPU compute ops and AdamW math (core/cpu/ops_cpu.c): no runtime, no engine.
mt_add_unit_test(test_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops.c TIMEOUT 60 LABELS fsdp)

# The reductions of gradient clipping (core/cpu/ops_reduce.c): sum of squares into one double,
# scale; the CUDA versions are compared with these in tests/gpu/test_gpu_reduce_ops.c.
mt_add_unit_test(test_ops_reduce SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_reduce.c TIMEOUT 60
                 LABELS fsdp)

# MT_DEVICE=cpu below: the engine (fsdp/) and models/mlp.c only touch device memory through ops,
# copies and collectives now, but test_mlp_grad reads the shard views' params and gradients
# through host pointers, and neither has run on a GPU (collectives on device buffers need NCCL);
# so a GPU machine still runs these on the CPU.
# The reference MLP through the FSDP engine on one rank: gradients against finite differences,
# clipping, one AdamW step (models/mlp.c, fsdp/clip.c, fsdp/optim_adamw.c).
mt_add_test_program(test_mlp_grad ${CMAKE_CURRENT_LIST_DIR}/test_mlp_grad.c)
mt_add_mp_test(test_mlp_grad TIMEOUT 60 LABELS fsdp ENV MT_TIMEOUT_S=30 MT_DEVICE=cpu
  COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node 1
          $<TARGET_FILE:test_mlp_grad>)

# The example as a user runs it: 2 ranks, a few steps, the loss goes down.
mt_add_mp_test(example_fsdp_mlp TIMEOUT 90 LABELS fsdp ENV MT_TIMEOUT_S=30 MT_DEVICE=cpu
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/example_fsdp_mlp.sh ${CMAKE_BINARY_DIR}/bin/mtrun
          $<TARGET_FILE:fsdp_mlp>)
