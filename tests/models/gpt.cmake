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
