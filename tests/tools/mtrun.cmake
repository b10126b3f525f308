# mtrun (tools/mtrun): launcher tests, bash drivers that start mtrun as a user would.
mt_add_test_program(prog_mtrun_worker ${CMAKE_CURRENT_LIST_DIR}/prog_mtrun_worker.c)
mt_add_test_program(prog_mtrun_freeport ${CMAKE_CURRENT_LIST_DIR}/prog_mtrun_freeport.c)
mt_add_test_program(prog_fr_loop ${CMAKE_CURRENT_LIST_DIR}/prog_fr_loop.c)

foreach(t env failure crossnode signal node_lost rdzv_errors sigterm options c10d logs restart
        host_stopped link_cut flightrec)
  if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/mtrun_${t}.sh)
    mt_add_mp_test(mtrun_${t}
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/mtrun_${t}.sh $<TARGET_FILE:mtrun>
              $<TARGET_FILE:prog_mtrun_worker> $<TARGET_FILE:prog_mtrun_freeport>
      TIMEOUT 120)
  endif()
endforeach()
# Seven scenarios, two of them waiting out node 0's 10 s gathering deadline or a timeout.
math(EXPR fr_timeout "240 * ${MT_TEST_TIMEOUT_FACTOR}")
set_tests_properties(mtrun_flightrec PROPERTIES TIMEOUT ${fr_timeout})
# Where no user and network namespace can be made, the link-cut test says so and is skipped.
set_tests_properties(mtrun_link_cut PROPERTIES SKIP_RETURN_CODE 77)

# The flight recorder's hang analysis (tools/mtrun/diagnose.c) on synthetic rings.
mt_add_unit_test(test_diagnose SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_diagnose.c
                 ${CMAKE_SOURCE_DIR}/tools/mtrun/diagnose.c TIMEOUT 30)
target_include_directories(test_diagnose PRIVATE ${CMAKE_SOURCE_DIR}/tools/mtrun)

# mtrun's reading of the rings (tools/mtrun/flightrec.c): wrapped and torn slots, bad headers,
# group names that are not UTF-8, ring file names, reads while a new round's rings are made.
mt_add_unit_test(test_fr_read SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fr_read.c
                 ${CMAKE_SOURCE_DIR}/tools/mtrun/flightrec.c ${CMAKE_SOURCE_DIR}/tools/mtrun/msg.c
                 TIMEOUT 30)
target_include_directories(test_fr_read PRIVATE ${CMAKE_SOURCE_DIR}/tools/mtrun)

# The store's security under mtrun: loopback-only listeners (ss), token files and tokens across
# nodes, MT_SOCKET_IFNAME on a real interface; prog_init (tests/mesh) is a rank with a store
# connection and UCX endpoints.
mt_add_mp_test(mtrun_security
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/mtrun_security.sh $<TARGET_FILE:mtrun>
          $<TARGET_FILE:prog_mtrun_worker> $<TARGET_FILE:prog_mtrun_freeport>
          $<TARGET_FILE:prog_init>
  TIMEOUT 180)
