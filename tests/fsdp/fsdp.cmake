# FSDP's schedule on one process, no launcher (fsdp/fsdp_schedule.c through module hooks):
# recorded order, prefetch and reduce-scatter counters, switches, nesting with a user's hooks.
mt_add_unit_test(test_fsdp_schedule SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fsdp_schedule.c
                 TIMEOUT 60 LABELS fsdp ENV MT_DEVICE=cpu MT_TIMEOUT_S=30)
# Ranks whose models differ are refused at mt_fsdp_shard with the first difference named.
mt_add_test_program(prog_fsdp_mismatch ${CMAKE_CURRENT_LIST_DIR}/prog_fsdp_mismatch.c)
mt_add_mp_test(fsdp_ranks_disagree TIMEOUT 60 LABELS fsdp ENV MT_TIMEOUT_S=30 MT_DEVICE=cpu
  COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node 3
          $<TARGET_FILE:prog_fsdp_mismatch>)
# Only ranks that shard together must agree: two pipeline stages with different models do not.
mt_add_mp_test(fsdp_stages_differ TIMEOUT 60 LABELS fsdp ENV MT_TIMEOUT_S=30 MT_DEVICE=cpu
  COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node 4
          $<TARGET_FILE:prog_fsdp_mismatch> --stages)
# FSDP at one rank unshards into the master shard and adds gradients into the gradient shard:
# the GPT's gradients bit for bit those of the unsharded model, no full buffers, and a backward
# onto non-zero shards still through its own buffer (g + g exactly).
mt_add_unit_test(test_fsdp_one_rank SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fsdp_one_rank.c
                 TIMEOUT 60 LABELS fsdp ENV MT_DEVICE=cpu MT_TIMEOUT_S=30)
# A backward that fails part-way leaves zeros (grad_shard_zero set) in the shards of the units
# whose backward failed, at one rank where the gradient was aliased into the shard too, and the
# next step gives a clean step's bits; at 2 ranks a reduce-scatter into the shard that fails to
# launch (MT_TEST_COLL_LAUNCH_FAIL's switch) leaves zeros too and the model refuses its next step.
mt_add_test_program(prog_fsdp_failed_grads ${CMAKE_CURRENT_LIST_DIR}/prog_fsdp_failed_grads.c)
foreach(np 1 2)
  mt_add_mp_test(fsdp_failed_grads_np${np} TIMEOUT 120 LABELS fsdp
    ENV MT_TIMEOUT_S=30 MT_DEVICE=cpu
    COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node ${np}
            ${MT_TEST_BIN}/prog_fsdp_failed_grads)
endforeach()
# Gradient clipping's sums of squares taken by the reduce-scatter into the shards
# (comm/coll_squares.h): the bits of the kernel over each shard, the same norm as read from the
# shards, dropped by whatever changes the shards. On every reduce-scatter path: the ring (2 ranks,
# and 4 with MT_COMM_LOCAL_DIRECT_RS=0), the one-pass local path (3 and 4 ranks), chunks of the
# pipeline one chunk of the sums long, the direct path of small messages, dp x tp; from a pass
# after the reductions where the ring's chunks do not start on chunks of the sums (100000 bytes)
# and where the local path's chunks are shorter than one (the small root unit at 3 and 4 ranks);
# none with MT_FSDP_FUSED_SQUARES=0.
mt_add_test_program(prog_fused_squares ${CMAKE_CURRENT_LIST_DIR}/prog_fused_squares.c)
target_link_libraries(prog_fused_squares PRIVATE m)
foreach(v "2;fused;" "3;fused;MT_COMM_CHUNK_BYTES=65536" "4;fused;"
          "4;fused;MT_COMM_LOCAL_DIRECT_RS=0" "2;fused;MT_COMM_CHUNK_BYTES=65536"
          "4;fused;MT_COMM_SMALL_BYTES=16777216" "2;fused;MT_COMM_CHUNK_BYTES=100000"
          "2;unfused;MT_FSDP_FUSED_SQUARES=0")
  list(GET v 0 np)
  list(GET v 1 expect)
  list(GET v 2 env)
  string(REGEX REPLACE "MT_(COMM|FSDP)_" "" tag "${env}")
  string(REPLACE "=" "_" tag "${tag}")
  string(TOLOWER "${tag}" tag)
  set(name fsdp_fused_squares_np${np})
  if(tag)
    set(name ${name}_${tag})
  endif()
  mt_add_mp_test(${name} TIMEOUT 120 LABELS fsdp ENV MT_TIMEOUT_S=30 MT_DEVICE=cpu ${env}
    COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node ${np}
            ${MT_TEST_BIN}/prog_fused_squares --expect ${expect})
endforeach()
mt_add_mp_test(fsdp_fused_squares_dp2_tp2 TIMEOUT 120 LABELS fsdp ENV MT_TIMEOUT_S=30
  MT_DEVICE=cpu
  COMMAND ${CMAKE_BINARY_DIR}/bin/mtrun --standalone --nproc_per_node 4
          ${MT_TEST_BIN}/prog_fused_squares --tp 2 --expect fused)
