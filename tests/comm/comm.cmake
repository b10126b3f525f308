# Host collectives: the host backend (comm/host/, comm/progress.c, group.c, coll_*.c), run
# through mtrun as a user would: every collective x {f32, bf16} x sizes from 0 to 64 MiB (total
# buffer) x group sizes 1, 2, 3, 4, 8; about a minute and a half on 2 cores.
mt_add_test_program(test_collectives ${CMAKE_CURRENT_LIST_DIR}/test_collectives.c)
target_link_libraries(test_collectives PRIVATE m)

set(MT_COMM_MTRUN ${CMAKE_BINARY_DIR}/bin/mtrun)
set(MT_COMM_PROG ${MT_TEST_BIN}/test_collectives)
set(MT_COMM_ENV MT_TIMEOUT_S=120)

foreach(np 1 2 3 4 8)
  mt_add_mp_test(comm_collectives_np${np} TIMEOUT 300 LABELS comm ENV ${MT_COMM_ENV}
    COMMAND ${MT_COMM_MTRUN} --standalone --nproc_per_node ${np} ${MT_COMM_PROG}
            --max-bytes 67108864 --max-bytes-bf16 67108864)
endforeach()

# Buffers from the rank's CPU device: large ones are shared memory that local peers read directly
# (comm/host/shm.c). Malloc'd buffers above go through UCX (cma) instead, except the
# collectives' own scratch, which comes from the device too; MT_COMM_SHM=0 turns the path off.
foreach(np 2 3 4)
  mt_add_mp_test(comm_collectives_shm_np${np} TIMEOUT 300 LABELS comm ENV ${MT_COMM_ENV}
    COMMAND ${MT_COMM_MTRUN} --standalone --nproc_per_node ${np} ${MT_COMM_PROG}
            --device-buffers --max-bytes 67108864 --max-bytes-bf16 16777216)
endforeach()
# A reduce-scatter among 3 or more ranks of one host sums all inputs in one pass where they lie
# (comm/coll_build.c, build_local_reduce_scatter); the ring stays reachable (and tested) with
# MT_COMM_LOCAL_DIRECT_RS=0. Small chunks and window: many chunks per block, scratch slots reused.
mt_add_mp_test(comm_collectives_ring_rs_np4 TIMEOUT 300 LABELS comm
  ENV ${MT_COMM_ENV} MT_COMM_LOCAL_DIRECT_RS=0
  COMMAND ${MT_COMM_MTRUN} --standalone --nproc_per_node 4 ${MT_COMM_PROG}
          --device-buffers --max-bytes 16777216 --max-bytes-bf16 4194304)
mt_add_mp_test(comm_collectives_small_chunks_np3 TIMEOUT 300 LABELS comm
  ENV ${MT_COMM_ENV} MT_COMM_CHUNK_BYTES=65536 MT_COMM_WINDOW=2
  COMMAND ${MT_COMM_MTRUN} --standalone --nproc_per_node 3 ${MT_COMM_PROG}
          --device-buffers --max-bytes 4194304 --max-bytes-bf16 4194304)
mt_add_mp_test(comm_collectives_noshm_np3 TIMEOUT 300 LABELS comm
  ENV ${MT_COMM_ENV} MT_COMM_SHM=0
  COMMAND ${MT_COMM_MTRUN} --standalone --nproc_per_node 3 ${MT_COMM_PROG}
          --device-buffers --max-bytes 16777216 --max-bytes-bf16 16777216)

# Two mtrun "nodes" on 127.0.0.1 forming one job over UCX tcp, started in both orders.
mt_add_mp_test(comm_two_nodes TIMEOUT 400 LABELS comm
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/comm_two_nodes.sh ${MT_COMM_MTRUN} ${MT_COMM_PROG})

# A rank that stops answering: the others time out naming it, then everyone exits cleanly.
mt_add_mp_test(comm_peer_timeout TIMEOUT 90 LABELS comm ENV MT_TIMEOUT_S=5
  COMMAND ${MT_COMM_MTRUN} --standalone --nproc_per_node 4 ${MT_COMM_PROG} --sleeper 2)

# Offload staging copies over UCX between the host tier and device memory (comm/host/stage.c).
mt_add_unit_test(test_stage SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_stage.c TIMEOUT 60
                 LABELS comm)

# Traffic counters (mt_group_counters) count a collective only once it launched: launches failed
# by MT_TEST_COLL_LAUNCH_FAIL=1 leave them unchanged.
foreach(np 1 3)
  mt_add_mp_test(comm_counters_np${np} TIMEOUT 60 LABELS comm ENV ${MT_COMM_ENV}
    COMMAND ${MT_COMM_MTRUN} --standalone --nproc_per_node ${np} ${MT_COMM_PROG} --counters)
endforeach()

# The shared-memory path's fallback to UCX where the kernel refuses pidfd_getfd, and a tuning
# variable out of range refused at start (tests/comm/comm_env_fallback.sh).
mt_add_mp_test(comm_env_fallback TIMEOUT 200 LABELS comm
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/comm_env_fallback.sh ${MT_COMM_MTRUN} ${MT_COMM_PROG})
