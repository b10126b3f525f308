# Host collectives: the reduction kernels (comm/reduce.c).
mt_add_unit_test(test_reduce SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_reduce.c TIMEOUT 30 LABELS comm)
