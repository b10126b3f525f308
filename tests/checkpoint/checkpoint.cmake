# Sharded checkpoints (checkpoint/): the mapping between flat FSDP shards and global boxes.
mt_add_unit_test(test_ckpt_layout SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ckpt_layout.c
                 TIMEOUT 60 LABELS checkpoint)

# safetensors both ways through mt-ckpt and train_gpt, checked from Python (MT_TEST_PYTHON).
foreach(variant export import)
  mt_add_mp_test(ckpt_safetensors_${variant} TIMEOUT 300 LABELS checkpoint ENV MT_TIMEOUT_S=60
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/ckpt_export.sh $<TARGET_FILE:mtrun>
            $<TARGET_FILE:train_gpt> $<TARGET_FILE:mt-ckpt> ${MT_TEST_PYTHON} ${variant})
endforeach()

# HSDP: only replicate rank 0 writes; the checkpoint loads into FSDP over 4 and into HSDP.
mt_add_test_program(prog_ckpt_hsdp ${CMAKE_CURRENT_LIST_DIR}/prog_ckpt_hsdp.c)
mt_add_mp_test(ckpt_hsdp TIMEOUT 120 LABELS checkpoint ENV MT_TIMEOUT_S=60 MT_DEVICE=cpu
  COMMAND bash -c "d=$(mktemp -d) && $<TARGET_FILE:mtrun> --standalone --nproc_per_node 4 $<TARGET_FILE:prog_ckpt_hsdp> $d; rc=$?; rm -rf $d; exit $rc")

# train_gpt saving and resuming through mtrun (tests/checkpoint/ckpt_train_gpt.sh says what each
# variant checks): an exact resume, resharding onto other layouts, a rank killed at each point of
# a save, a save failing on one rank, --keep.
foreach(variant exact_resume reshard crash_after_file crash_before_metadata crash_before_rename
        crash_before_latest fail_stage_1 fail_stage_0 fail_write_1 fail_write_0 schedule keep)
  # Each takes 1-5 s on 2 cores; reshard, the longest, runs 7 jobs.
  mt_add_mp_test(ckpt_${variant} TIMEOUT 180 LABELS checkpoint ENV MT_TIMEOUT_S=60
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/ckpt_train_gpt.sh $<TARGET_FILE:mtrun>
            $<TARGET_FILE:train_gpt> ${variant})
endforeach()

# Damaged checkpoints refused on every rank, nothing changed (prog_ckpt_bad.c, public API only).
mt_add_test_program(prog_ckpt_bad ${CMAKE_CURRENT_LIST_DIR}/prog_ckpt_bad.c)
target_link_libraries(prog_ckpt_bad PRIVATE m)
foreach(variant dp2 tp2)
  mt_add_mp_test(ckpt_bad_files_${variant} TIMEOUT 120 LABELS checkpoint ENV MT_TIMEOUT_S=30
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/ckpt_bad_files.sh $<TARGET_FILE:mtrun>
            $<TARGET_FILE:prog_ckpt_bad> ${variant})
endforeach()


# A save refused on one rank (a deferred parameter it never initialised) is refused on every
# rank, without waiting for MT_TIMEOUT_S (prog_ckpt_uninit.c).
mt_add_test_program(prog_ckpt_uninit ${CMAKE_CURRENT_LIST_DIR}/prog_ckpt_uninit.c)
mt_add_mp_test(ckpt_uninit_one_rank TIMEOUT 60 LABELS checkpoint ENV MT_TIMEOUT_S=20 MT_DEVICE=cpu
  COMMAND bash -c "d=$(mktemp -d) && $<TARGET_FILE:mtrun> --standalone --nproc_per_node 2 $<TARGET_FILE:prog_ckpt_uninit> $d; rc=$?; rm -rf $d; exit $rc")
