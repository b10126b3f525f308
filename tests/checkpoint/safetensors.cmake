# The safetensors reader/writer of mt-ckpt (tools/mt-ckpt/safetensors.c, compiled into each test
# program: it is the tool's code, not the library's). test_safetensors: headers, files, the
# writer, F16/BF16; safetensors_python: files exchanged with the Python safetensors package in
# the virtual environment scripts/setup creates (MT_TEST_PYTHON).
set(MT_SAFETENSORS_SRC ${CMAKE_SOURCE_DIR}/tools/mt-ckpt/safetensors.c)
mt_add_unit_test(test_safetensors SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_safetensors.c
                 ${MT_SAFETENSORS_SRC} TIMEOUT 60 LABELS checkpoint)
mt_add_test_program(st_convert ${CMAKE_CURRENT_LIST_DIR}/st_convert.c ${MT_SAFETENSORS_SRC})
add_test(NAME safetensors_python
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/safetensors_python.sh ${MT_TEST_PYTHON}
                 $<TARGET_FILE:st_convert>)
set_tests_properties(safetensors_python PROPERTIES TIMEOUT 120 LABELS "unit;checkpoint")
