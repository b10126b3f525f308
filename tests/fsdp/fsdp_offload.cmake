# FSDP offload's capacity demonstration (tests/fsdp/fsdp_offload_demo.sh). 48 MiB: below the
# 128 MiB the default MLP of examples/fsdp_offload_demo.c needs without offload, above what its
# layers in flight need with full offload (about 28.4 MiB).
mt_add_test_program(test_fsdp_offload_demo ${CMAKE_SOURCE_DIR}/examples/fsdp_offload_demo.c)
mt_add_mp_test(fsdp_offload_demo TIMEOUT 300 LABELS fsdp ENV MT_TIMEOUT_S=60
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/fsdp_offload_demo.sh ${CMAKE_BINARY_DIR}/bin/mtrun
          ${MT_TEST_BIN}/test_fsdp_offload_demo 48MiB)
