# train_gpt (examples/train_gpt.c) through mtrun, as a user runs it: TP = 2 and 4, dp 2 x tp 2,
# two nodes and gradient accumulation against one rank; the loss falling on the default text;
# every bad argument; a uint16 token file with --vocab 1000 and 1001 (dp, tp, padding) and its
# bad inputs; sequence parallelism against the same runs without it. tests/examples/train_gpt.sh says what each variant runs.
foreach(variant tp dp_tp two_nodes two_nodes_c10d restart accum loss_falls errors tokens tokens_pad token_errors
        recompute sequence_parallel reshard)
  mt_add_mp_test(train_gpt_${variant} TIMEOUT 300 LABELS gpt ENV MT_TIMEOUT_S=60
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train_gpt.sh $<TARGET_FILE:mtrun>
            $<TARGET_FILE:train_gpt> ${variant})
endforeach()
