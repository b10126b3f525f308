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
