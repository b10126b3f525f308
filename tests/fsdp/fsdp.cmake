# FSDP's schedule on one process, no launcher (fsdp/fsdp_schedule.c through module hooks):
# recorded order, prefetch and reduce-scatter counters, switches, nesting with a user's hooks.
mt_add_unit_test(test_fsdp_schedule SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fsdp_schedule.c
                 TIMEOUT 60 LABELS fsdp ENV MT_DEVICE=cpu MT_TIMEOUT_S=30)
