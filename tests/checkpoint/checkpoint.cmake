# Sharded checkpoints (checkpoint/): the mapping between flat FSDP shards and global boxes.
mt_add_unit_test(test_ckpt_layout SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ckpt_layout.c
                 TIMEOUT 60 LABELS checkpoint)
