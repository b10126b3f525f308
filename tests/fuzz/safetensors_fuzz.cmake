# mt-ckpt's safetensors header parser under mutated input (a fixed-seed driver; the same file
# builds as a libFuzzer target, see its header). The parser is the tool's code, compiled in.
mt_add_unit_test(fuzz_safetensors SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_safetensors.c
                 ${CMAKE_SOURCE_DIR}/tools/mt-ckpt/safetensors.c TIMEOUT 60 LABELS fuzz checkpoint)
