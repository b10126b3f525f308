# The example as a user runs it: 2 ranks, a few steps, the loss goes down.
mt_add_mp_test(example_fsdp_mlp TIMEOUT 90 LABELS fsdp ENV MT_TIMEOUT_S=30 MT_DEVICE=cpu
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/example_fsdp_mlp.sh ${CMAKE_BINARY_DIR}/bin/mtrun
          $<TARGET_FILE:fsdp_mlp>)
