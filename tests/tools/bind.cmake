# mtrun --bind and MT_TOPO_FILE (topo/bind.c, tools/mtrun/binding.c): bash drivers that start
# mtrun as a user would, on this machine's real cores and on a fixture file's machine.
mt_add_test_program(prog_bind_report ${CMAKE_CURRENT_LIST_DIR}/prog_bind_report.c)

foreach(t bind bind_file)
  mt_add_mp_test(mtrun_${t}
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/mtrun_${t}.sh $<TARGET_FILE:mtrun>
            $<TARGET_FILE:prog_bind_report> ${CMAKE_SOURCE_DIR}/tests/fixtures/topologies
    TIMEOUT 120 LABELS topo)
endforeach()
