# Module hooks on one process (module/module_hooks.c): order of pre/post forward/backward hooks
# and functions, nesting of owners, release, failures, refusals.
mt_add_unit_test(test_module_hooks SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_module_hooks.c
                 TIMEOUT 60 LABELS module ENV MT_DEVICE=cpu MT_TIMEOUT_S=30)
# The tp dimension of a module: default, set by the program, refusals, a named tp context.
mt_add_unit_test(test_module_tp_dim SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_module_tp_dim.c
                 TIMEOUT 60 LABELS module ENV MT_DEVICE=cpu MT_TIMEOUT_S=30)
