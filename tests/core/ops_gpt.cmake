# GPT ops on the CPU (core/cpu/ops_{embed,layernorm,gelu,attention,xent}.c): forwards against
# double references, backwards against finite differences, the vocabulary-parallel
# cross-entropy over slices against the full one.
mt_add_unit_test(test_ops_gpt SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_gpt.c TIMEOUT 60
                 LABELS gpt)

# The backward ops' overwrite forms (MT_OVERWRITE_*) against the plain ops adding into zeros,
# bit for bit, every flag combination, also for thin products and no rows (test_ops_overwrite.c);
# on each bf16 product path forced: ops_dispatch.cmake.
mt_add_unit_test(test_ops_overwrite SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_overwrite.c
                 TIMEOUT 60 LABELS gpt)

# The CPU attention at its edges (1, 63, 64, 65, 130 positions; head sizes 1, 3, 12, 20; short
# last chunks of pairs) against a double reference, on 3 threads (chunks run concurrently).
mt_add_unit_test(test_attention_edges SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_attention_edges.c
                 TIMEOUT 120 LABELS gpt ENV MT_NUM_THREADS=3)
