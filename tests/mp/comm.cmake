# Host collectives over UCX (mesh/transport_ucx.c, progress.c, group.c, coll_*.c, p2p.c), run
# through mtrun as a user would. Sizes are capped by total buffer bytes per group size so that the
# area stays within a few minutes on 2 cores (64 MiB at most: the largest size the issue asks for).
mt_add_test_program(test_collectives ${CMAKE_CURRENT_LIST_DIR}/test_collectives.c)
target_link_libraries(test_collectives PRIVATE m)

set(MT_COMM_MTRUN ${CMAKE_BINARY_DIR}/bin/mtrun)
set(MT_COMM_PROG ${MT_TEST_BIN}/test_collectives)
set(MT_COMM_ENV MT_TIMEOUT_S=120)

mt_add_mp_test(comm_collectives_np1 TIMEOUT 300 LABELS comm ENV ${MT_COMM_ENV}
  COMMAND ${MT_COMM_MTRUN} --standalone --nproc_per_node 1 ${MT_COMM_PROG}
          --max-bytes 67108864 --max-bytes-bf16 67108864)
mt_add_mp_test(comm_collectives_np2 TIMEOUT 300 LABELS comm ENV ${MT_COMM_ENV}
  COMMAND ${MT_COMM_MTRUN} --standalone --nproc_per_node 2 ${MT_COMM_PROG}
          --max-bytes 67108864 --max-bytes-bf16 67108864)
mt_add_mp_test(comm_collectives_np3 TIMEOUT 300 LABELS comm ENV ${MT_COMM_ENV}
  COMMAND ${MT_COMM_MTRUN} --standalone --nproc_per_node 3 ${MT_COMM_PROG}
          --max-bytes 67108864 --max-bytes-bf16 67108864)
mt_add_mp_test(comm_collectives_np4 TIMEOUT 300 LABELS comm ENV ${MT_COMM_ENV}
  COMMAND ${MT_COMM_MTRUN} --standalone --nproc_per_node 4 ${MT_COMM_PROG}
          --max-bytes 67108864 --max-bytes-bf16 67108864)
mt_add_mp_test(comm_collectives_np8 TIMEOUT 300 LABELS comm ENV ${MT_COMM_ENV}
  COMMAND ${MT_COMM_MTRUN} --standalone --nproc_per_node 8 ${MT_COMM_PROG}
          --max-bytes 67108864 --max-bytes-bf16 67108864)

# Two mtrun "nodes" on 127.0.0.1 forming one job over UCX tcp, started in both orders.
mt_add_mp_test(comm_two_nodes TIMEOUT 400 LABELS comm
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/comm_two_nodes.sh ${MT_COMM_MTRUN} ${MT_COMM_PROG})

# A rank that stops answering: the others time out naming it, then everyone exits cleanly.
mt_add_mp_test(comm_peer_timeout TIMEOUT 90 LABELS comm ENV MT_TIMEOUT_S=5
  COMMAND ${MT_COMM_MTRUN} --standalone --nproc_per_node 4 ${MT_COMM_PROG} --sleeper 2)
