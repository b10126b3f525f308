# FSDP engine (module/module.c, fsdp_unit.c, fsdp_schedule.c) on a toy model, through mtrun:
# gathered values, averaged gradient shards, padding, prefetch order, reshard_after_forward,
# accumulation, bf16, memory categories; HSDP 2x2; a lost rank becomes an error.
mt_add_test_program(test_fsdp_engine ${CMAKE_CURRENT_LIST_DIR}/test_fsdp_engine.c)
target_link_libraries(test_fsdp_engine PRIVATE m)
set(MT_FSDP_ENGINE_MTRUN ${CMAKE_BINARY_DIR}/bin/mtrun)
set(MT_FSDP_ENGINE_PROG ${MT_TEST_BIN}/test_fsdp_engine)

foreach(np 1 2 3 4)
  mt_add_mp_test(fsdp_engine_np${np} TIMEOUT 120 LABELS fsdp ENV MT_TIMEOUT_S=60
    COMMAND ${MT_FSDP_ENGINE_MTRUN} --standalone --nproc_per_node ${np} ${MT_FSDP_ENGINE_PROG})
endforeach()

mt_add_mp_test(fsdp_engine_hsdp_2x2 TIMEOUT 120 LABELS fsdp ENV MT_TIMEOUT_S=60
  COMMAND ${MT_FSDP_ENGINE_MTRUN} --standalone --nproc_per_node 4 ${MT_FSDP_ENGINE_PROG} --hsdp)

# The last rank leaves after one step: the others' next step fails (error naming the unit)
# within MT_TIMEOUT_S, and every rank exits 0.
mt_add_mp_test(fsdp_engine_lost_rank TIMEOUT 120 LABELS fsdp ENV MT_TIMEOUT_S=10
  COMMAND ${MT_FSDP_ENGINE_MTRUN} --standalone --nproc_per_node 3 ${MT_FSDP_ENGINE_PROG}
          --lose-rank)
