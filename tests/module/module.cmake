# Module hooks on one process (module/module_hooks.c): order of pre/post forward/backward hooks
# and functions, nesting of owners, release, failures, refusals.
mt_add_unit_test(test_module_hooks SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_module_hooks.c
                 TIMEOUT 60 LABELS module ENV MT_DEVICE=cpu MT_TIMEOUT_S=30)
# The tp dimension of a module: default, set by the program, refusals, a named tp context.
mt_add_unit_test(test_module_tp_dim SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_module_tp_dim.c
                 TIMEOUT 60 LABELS module ENV MT_DEVICE=cpu MT_TIMEOUT_S=30)
# A module error on one rank ends the job within 10 s with the default MT_TIMEOUT_S, naming the
# rank and the module's message: under mtrun (2 and 4 ranks), by hand, and through mt_abort.
mt_add_test_program(prog_module_error ${CMAKE_CURRENT_LIST_DIR}/prog_module_error.c)
if(TARGET mtrun)
  mt_add_mp_test(module_error_fails_fast TIMEOUT 240 LABELS module
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/module_error.sh $<TARGET_FILE:prog_module_error>
            $<TARGET_FILE:mtrun>)
endif()
# Guards for user code: unique names in a tree, mt_param_f32 refusing bf16 and sharded values.
mt_add_unit_test(test_module_tree SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_module_tree.c
                 TIMEOUT 60 LABELS module ENV MT_DEVICE=cpu MT_TIMEOUT_S=30)
# Activation recompute (module/recompute.c): refusals, FSDP's gathers in both orders of enabling,
# the GPT bit for bit equal without it and its activation peak against the formula.
mt_add_unit_test(test_recompute SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_recompute.c
                 TIMEOUT 120 LABELS module ENV MT_DEVICE=cpu MT_TIMEOUT_S=30)
# Deferred parameters and the initialisers (module/param_init.c): sharded without being whole,
# refused uninitialised, initialised shard by shard bit for bit like the whole tensor, on 1 rank,
# dp 4 and dp 2 x tp 2; global offsets of the function initialiser; bad input.
mt_add_test_program(test_param_init ${CMAKE_CURRENT_LIST_DIR}/test_param_init.c)
target_link_libraries(test_param_init PRIVATE m)
foreach(layout "1;dp" "4;dp" "4;tp2")
  list(GET layout 0 np)
  list(GET layout 1 mode)
  mt_add_mp_test(param_init_np${np}_${mode} TIMEOUT 120 LABELS module ENV MT_TIMEOUT_S=60
    MT_DEVICE=cpu
    COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node ${np}
            $<TARGET_FILE:test_param_init> ${mode})
endforeach()
