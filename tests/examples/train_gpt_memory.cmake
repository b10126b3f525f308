# train_gpt's predicted memory peaks against the measured ones (tests/examples/
# train_gpt_memory.sh): a matrix of dp, tp, bf16, accumulation and prefetch configurations, one
# of FSDP CPU offload (device and host tier), and the device capacity at and just below the predicted total.
foreach(variant matrix offload capacity)
  mt_add_mp_test(train_gpt_memory_${variant} TIMEOUT 300 LABELS gpt ENV MT_TIMEOUT_S=60
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train_gpt_memory.sh $<TARGET_FILE:mtrun>
            $<TARGET_FILE:train_gpt> ${variant})
endforeach()
