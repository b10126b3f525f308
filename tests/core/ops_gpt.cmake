# GPT ops on the CPU (core/cpu/ops_{embed,layernorm,gelu,attention,xent}.c): forwards against
# double references, backwards against finite differences, the vocabulary-parallel
# cross-entropy over slices against the full one.
mt_add_unit_test(test_ops_gpt SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_gpt.c TIMEOUT 60
                 LABELS gpt)

# The backward ops' overwrite forms (MT_OVERWRITE_*) against the plain ops adding into zeros,
# bit for bit, every flag combination (test_ops_overwrite.c); on each bf16 product path forced:
# ops_dispatch.cmake.
mt_add_unit_test(test_ops_overwrite SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_overwrite.c
                 TIMEOUT 60 LABELS gpt)
