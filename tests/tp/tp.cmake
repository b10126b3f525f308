# Tensor-parallel layers with the GPT model, through mtrun. test_tp compares dp x tp runs
# with a single-rank reference written just before by the same program (test_tp.c says what is
# compared and how closely). All on the tiny model: layers 2, d_model 16, heads 4, seq 8.
mt_add_test_program(test_tp ${CMAKE_CURRENT_LIST_DIR}/test_tp.c)
target_link_libraries(test_tp PRIVATE m)

set(MT_TP_MTRUN ${CMAKE_BINARY_DIR}/bin/mtrun)
set(MT_TP_PROG ${MT_TEST_BIN}/test_tp)
set(MT_TP_REF_DIR ${CMAKE_CURRENT_BINARY_DIR})

# name, world size, tp, vocab (255: padded to a multiple of tp, the last rank's slice short),
# extra option of the compared run (bf16 parameters against the f32 reference; the mesh's tp
# dimension named "model" instead of "tp"; sequence parallelism, re-gathering or keeping the
# column-parallel inputs gathered, against the reference without). MT_DEBUG_POISON_GRADS: at dp 2
# FSDP's full gradient buffers start as NaN, so a gradient element the model's overwriting ops
# miss (a tp split, the padded vocabulary's rows, the sequence-parallel LayerNorm copies) fails
# the comparison instead of reading fresh pages' zeros.
foreach(spec "tp2;2;2;256;" "tp4;4;4;256;" "dp2_tp2;4;2;256;" "tp2_padded_vocab;2;2;255;"
        "dp2_tp2_bf16;4;2;256;--bf16" "tp2_named_dim;2;2;256;--tp-dim model"
        "tp2_sp;2;2;256;--sequence-parallel" "tp4_sp;4;4;256;--sequence-parallel"
        "dp2_tp2_sp;4;2;256;--sequence-parallel" "tp2_sp_padded_vocab;2;2;255;--sequence-parallel"
        "dp2_tp2_sp_bf16;4;2;256;--sequence-parallel --bf16"
        "tp2_spk;2;2;256;--sequence-parallel=keep-gathered"
        "tp4_spk;4;4;256;--sequence-parallel=keep-gathered"
        "dp2_tp2_spk_bf16;4;2;256;--sequence-parallel=keep-gathered --bf16"
        "tp2_spk_padded_vocab;2;2;255;--sequence-parallel=keep-gathered"
        "dp2_tp2_sp_padded_vocab;4;2;255;--sequence-parallel"
        "dp2_tp2_spk_padded_vocab;4;2;255;--sequence-parallel=keep-gathered")
  list(GET spec 0 name)
  list(GET spec 1 np)
  list(GET spec 2 tp)
  list(GET spec 3 vocab)
  list(GET spec 4 extra)
  set(ref ${MT_TP_REF_DIR}/tp_ref_${name}.bin)
  mt_add_mp_test(tp_equiv_${name} TIMEOUT 180 LABELS tp
    ENV MT_TIMEOUT_S=60 MT_DEVICE=cpu MT_DEBUG_POISON_GRADS=1
    COMMAND sh -c "${MT_TP_MTRUN} --standalone --nproc_per_node 1 ${MT_TP_PROG} --vocab ${vocab} \
--out ${ref} && ${MT_TP_MTRUN} --standalone --nproc_per_node ${np} ${MT_TP_PROG} --tp ${tp} \
--vocab ${vocab} ${extra} --ref ${ref}")
endforeach()

# The sequence-parallel tp functions against the replicated ones (test_tp_sequence.c), on 1, 2
# and 4 ranks of one "tp" dimension.
mt_add_test_program(test_tp_sequence ${CMAKE_CURRENT_LIST_DIR}/test_tp_sequence.c)
target_link_libraries(test_tp_sequence PRIVATE m)
foreach(np 1 2 4)
  mt_add_mp_test(tp_sequence_np${np} TIMEOUT 120 LABELS tp ENV MT_TIMEOUT_S=60 MT_DEVICE=cpu
    COMMAND ${MT_TP_MTRUN} --standalone --nproc_per_node ${np} $<TARGET_FILE:test_tp_sequence>)
endforeach()

# The tp linear backwards with no rows (test_tp_no_rows.c): overwrite flags zero d_w / d_b, no
# flags leave them, MT_OVERWRITE_D_IN refused; one process, a tp context of size 1.
mt_add_unit_test(test_tp_no_rows SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tp_no_rows.c TIMEOUT 30
                 LABELS tp)
