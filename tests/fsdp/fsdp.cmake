# FSDP's schedule on one process, no launcher (fsdp/fsdp_schedule.c through module hooks):
# recorded order, prefetch and reduce-scatter counters, switches, nesting with a user's hooks.
mt_add_unit_test(test_fsdp_schedule SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fsdp_schedule.c
                 TIMEOUT 60 LABELS fsdp ENV MT_DEVICE=cpu MT_TIMEOUT_S=30)
# Ranks whose models differ are refused at mt_fsdp_shard with the first difference named.
mt_add_test_program(prog_fsdp_mismatch ${CMAKE_CURRENT_LIST_DIR}/prog_fsdp_mismatch.c)
mt_add_mp_test(fsdp_ranks_disagree TIMEOUT 60 LABELS fsdp ENV MT_TIMEOUT_S=30 MT_DEVICE=cpu
  COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node 3
          $<TARGET_FILE:prog_fsdp_mismatch>)
# Only ranks that shard together must agree: two pipeline stages with different models do not.
mt_add_mp_test(fsdp_stages_differ TIMEOUT 60 LABELS fsdp ENV MT_TIMEOUT_S=30 MT_DEVICE=cpu
  COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node 4
          $<TARGET_FILE:prog_fsdp_mismatch> --stages)
# FSDP at one rank unshards into the master shard and adds gradients into the gradient shard:
# the GPT's gradients bit for bit those of the unsharded model, no full buffers, and a backward
# onto non-zero shards still through its own buffer (g + g exactly).
mt_add_unit_test(test_fsdp_one_rank SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fsdp_one_rank.c
                 TIMEOUT 60 LABELS fsdp ENV MT_DEVICE=cpu MT_TIMEOUT_S=30)
# A backward that fails part-way leaves zeros (grad_shard_zero set) in the shards of the units
# whose backward failed, at one rank where the gradient was aliased into the shard too, and the
# next step gives a clean step's bits; at 2 ranks a reduce-scatter into the shard that fails to
# launch (MT_TEST_COLL_LAUNCH_FAIL's switch) leaves zeros too and the model refuses its next step.
mt_add_test_program(prog_fsdp_failed_grads ${CMAKE_CURRENT_LIST_DIR}/prog_fsdp_failed_grads.c)
foreach(np 1 2)
  mt_add_mp_test(fsdp_failed_grads_np${np} TIMEOUT 120 LABELS fsdp
    ENV MT_TIMEOUT_S=30 MT_DEVICE=cpu
    COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node ${np}
            ${MT_TEST_BIN}/prog_fsdp_failed_grads)
endforeach()
