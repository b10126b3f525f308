# FSDP equivalence, determinism and the out-of-memory demonstration, through mtrun as
# a user runs training. Each variant is one test of fsdp_equiv.sh (which says what it runs); the
# runs are small (an MLP of 4 layers of width 64, 10 steps) so that the set takes a few minutes
# on 2 cores.
mt_add_test_program(test_fsdp_equiv ${CMAKE_CURRENT_LIST_DIR}/test_fsdp_equiv.c)
target_link_libraries(test_fsdp_equiv PRIVATE m)
# The example of examples/fsdp_oom_demo.c, built here under its own name for the test.
mt_add_test_program(test_fsdp_oom_demo ${CMAKE_SOURCE_DIR}/examples/fsdp_oom_demo.c)

set(MT_FSDP_EQUIV_MTRUN ${CMAKE_BINARY_DIR}/bin/mtrun)
foreach(variant f32 noprefetch noreshard hsdp accum clip bf16 determinism mapped)
  mt_add_mp_test(fsdp_equiv_${variant} TIMEOUT 240 LABELS fsdp ENV MT_TIMEOUT_S=60
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/fsdp_equiv.sh ${MT_FSDP_EQUIV_MTRUN}
            ${MT_TEST_BIN}/test_fsdp_equiv ${variant})
endforeach()

# 80 MiB: below the 128 MiB the default MLP needs on one rank, above what one of 4 ranks needs.
mt_add_mp_test(fsdp_oom_demo TIMEOUT 300 LABELS fsdp ENV MT_TIMEOUT_S=60
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/fsdp_equiv_oom.sh ${MT_FSDP_EQUIV_MTRUN}
          ${MT_TEST_BIN}/test_fsdp_oom_demo 80MiB)
