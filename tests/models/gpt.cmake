# The GPT model (models/gpt.c) on one rank through mtrun: every parameter's gradient against
# finite differences on the tiny model (layers 2, d_model 16, heads 4, seq 8).
mt_add_test_program(test_gpt_grad ${CMAKE_CURRENT_LIST_DIR}/test_gpt_grad.c)
target_link_libraries(test_gpt_grad PRIVATE m)
mt_add_mp_test(gpt_grad_fd TIMEOUT 120 LABELS tp ENV MT_TIMEOUT_S=60 MT_DEVICE=cpu
  COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node 1
          ${MT_TEST_BIN}/test_gpt_grad)

# The memory predictor's argument checks and its activation checkpointing and sequence
# parallelism terms (tests/models/test_gpt_memory.c).
mt_add_unit_test(test_gpt_memory SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt_memory.c TIMEOUT 30
  LABELS gpt)

# The memory predictor against the device's accounting for what train_gpt cannot run: HSDP and
# the reshard_after_forward policies (tests/models/test_gpt_memory_mesh.c). Each entry: name,
# ranks, then REP DP TP RESHARD PARAM_DTYPE REDUCE_DTYPE ACCUM PREFETCH.
mt_add_test_program(test_gpt_memory_mesh ${CMAKE_CURRENT_LIST_DIR}/test_gpt_memory_mesh.c)
foreach(entry
    "hsdp|4|2 2 1 -1 f32 f32 1 1"
    "hsdp_tp_bf16|4|2 1 2 -1 bf16 bf16 2 1"
    "keep_after_forward|2|1 2 1 0 f32 f32 1 1"
    "reshard_root|2|1 2 1 1 f32 bf16 2 0"
    "keep_tp_accum|4|1 2 2 0 bf16 f32 2 1")
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 name)
  list(GET parts 1 ranks)
  list(GET parts 2 args)
  separate_arguments(args)
  mt_add_mp_test(gpt_memory_${name} TIMEOUT 120 LABELS gpt ENV MT_TIMEOUT_S=60 MT_DEVICE=cpu
    COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node ${ranks}
            ${MT_TEST_BIN}/test_gpt_memory_mesh ${args})
endforeach()
# A GPT built deferred on 8 ranks under a device cap: constructed and sharded under a third of
# the whole f32 model (eager creation fails there), 3 training steps under 70% of it.
mt_add_test_program(prog_gpt_deferred_mem ${CMAKE_CURRENT_LIST_DIR}/prog_gpt_deferred_mem.c)
target_link_libraries(prog_gpt_deferred_mem PRIVATE m)
mt_add_mp_test(gpt_deferred_mem TIMEOUT 180 LABELS tp ENV MT_TIMEOUT_S=60
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/gpt_deferred_mem.sh ${CMAKE_BINARY_DIR}/bin/mtrun
          $<TARGET_FILE:prog_gpt_deferred_mem>)
# GPT initial values are the same bits on 1 rank, dp 4 and dp 2 x tp 2, initialised shard by
# shard or loaded from a checkpoint of the whole-tensor initialisation into a deferred model.
mt_add_test_program(prog_gpt_init_layouts ${CMAKE_CURRENT_LIST_DIR}/prog_gpt_init_layouts.c)
mt_add_mp_test(gpt_init_layouts TIMEOUT 120 LABELS tp ENV MT_TIMEOUT_S=60
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/gpt_init_layouts.sh ${CMAKE_BINARY_DIR}/bin/mtrun
          $<TARGET_FILE:prog_gpt_init_layouts>)
