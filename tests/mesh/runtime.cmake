# mt_init (mesh/runtime.c) in several processes: started by hand (RANK/WORLD_SIZE/MASTER_PORT),
# with a wrong world size on one rank, with a rank that never starts, and through mtrun.
mt_add_test_program(prog_init ${CMAKE_CURRENT_LIST_DIR}/prog_init.c)

foreach(t by_hand world_mismatch missing_rank)
  mt_add_mp_test(runtime_${t} TIMEOUT 90 LABELS runtime
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/runtime_${t}.sh $<TARGET_FILE:prog_init>)
endforeach()

if(TARGET mtrun)
  mt_add_mp_test(runtime_mtrun TIMEOUT 90 LABELS runtime
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/runtime_mtrun.sh $<TARGET_FILE:prog_init>
            $<TARGET_FILE:mtrun>)
  mt_add_mp_test(runtime_socket_ifname TIMEOUT 90 LABELS runtime
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/runtime_socket_ifname.sh $<TARGET_FILE:prog_init>
            $<TARGET_FILE:mtrun>)
endif()
