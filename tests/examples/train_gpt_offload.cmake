# FSDP offload through train_gpt (tests/examples/train_gpt_offload.sh): every policy bitwise
# equal to no offload on 1, 2 and 4 ranks, dp and dp x tp; a checkpoint saved offloaded and
# resumed; bad --offload / --offload-ratio; --offload-overlap bitwise equal to the plain step.
foreach(variant equiv resume errors overlap)
  mt_add_mp_test(train_gpt_offload_${variant} TIMEOUT 600 LABELS gpt ENV MT_TIMEOUT_S=60
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train_gpt_offload.sh $<TARGET_FILE:mtrun>
            $<TARGET_FILE:train_gpt> ${variant})
endforeach()
