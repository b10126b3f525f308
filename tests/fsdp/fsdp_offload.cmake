# FSDP offload's capacity demonstration (tests/fsdp/fsdp_offload_demo.sh). 48 MiB: below the
# 128 MiB the default MLP of examples/fsdp_offload_demo.c needs without offload, above what its
# layers in flight need with full offload (about 28.4 MiB).
mt_add_test_program(test_fsdp_offload_demo ${CMAKE_SOURCE_DIR}/examples/fsdp_offload_demo.c)
mt_add_mp_test(fsdp_offload_demo TIMEOUT 300 LABELS fsdp ENV MT_TIMEOUT_S=60
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/fsdp_offload_demo.sh ${CMAKE_BINARY_DIR}/bin/mtrun
          ${MT_TEST_BIN}/test_fsdp_offload_demo 48MiB)
# The overlapped optimizer step (mt_adamw_set_overlap): bitwise equal to the plain step, units
# stepped during the backward, clipping and a second synchronising backward refused.
mt_add_test_program(prog_adamw_overlap ${CMAKE_CURRENT_LIST_DIR}/prog_adamw_overlap.c)
foreach(np 1 2)
  foreach(policy optimizer full)
    mt_add_mp_test(adamw_overlap_np${np}_${policy} TIMEOUT 120 LABELS fsdp
      ENV MT_TIMEOUT_S=60 MT_DEVICE=cpu
      COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node ${np}
              ${MT_TEST_BIN}/prog_adamw_overlap ${policy})
  endforeach()
endforeach()
# Which units offload_ratio offloads (0, 0.25, 0.3, 0.5, 1), checked per unit at the engine level
# against the documented rule and the device / host-tier memory categories; a failed staging copy
# is reported at the model's teardown.
mt_add_test_program(prog_fsdp_offload_units ${CMAKE_CURRENT_LIST_DIR}/prog_fsdp_offload_units.c)
target_link_libraries(prog_fsdp_offload_units PRIVATE m)
foreach(np 1 2)
  mt_add_mp_test(fsdp_offload_units_np${np} TIMEOUT 120 LABELS fsdp
    ENV MT_TIMEOUT_S=60 MT_DEVICE=cpu
    COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node ${np}
            ${MT_TEST_BIN}/prog_fsdp_offload_units)
endforeach()
