# The public ops' argument checks and their dispatch on the device kind (core/ops.c).
mt_add_unit_test(test_ops_dispatch SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_dispatch.c TIMEOUT 30
                 LABELS core)
mt_add_unit_test(test_ops_cast SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_cast.c TIMEOUT 60 LABELS core)
# The bf16 matrix products (core/cpu/ops_bf16.c) against the f32 ops on pre-rounded operands.
mt_add_unit_test(test_ops_bf16 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ops_bf16.c TIMEOUT 60
                 LABELS core)
# And on each path of core/cpu/bf16_gemm_path.h whatever the CPU would choose (forced oneDNN
# emulates bf16 on an AVX-512 CPU without bf16 instructions; below AVX-512 oneDNN 2.6 has no bf16
# matmul and the program skips: 77); so does test_ops_overwrite (ops_gpt.cmake), whose bf16
# linears write the flagged outputs with beta 0 on either path.
foreach(path f32 onednn)
  foreach(prog test_ops_bf16 test_ops_overwrite)
    add_test(NAME ${prog}_${path} COMMAND ${prog})
    math(EXPR t "60 * ${MT_TEST_TIMEOUT_FACTOR}")
    set_tests_properties(${prog}_${path} PROPERTIES TIMEOUT ${t} LABELS "unit;core"
                         ENVIRONMENT "MT_CPU_BF16_GEMM=${path}" SKIP_RETURN_CODE 77)
  endforeach()
endforeach()
# A value that names no path fails the first bf16 product with a message that says which.
add_test(NAME test_ops_bf16_bad_path COMMAND test_ops_bf16)
set_tests_properties(test_ops_bf16_bad_path PROPERTIES TIMEOUT 60 LABELS "unit;core"
                     ENVIRONMENT "MT_CPU_BF16_GEMM=sgemm"
                     PASS_REGULAR_EXPRESSION "invalid argument: gemm_ex \\(bf16\\): MT_CPU_BF16_GEMM='sgemm': expected onednn, f32 or auto")
# The automatic choice when oneDNN is capped below its bf16 kernels (as on a CPU without bf16
# instructions): the widening path, never oneDNN's emulation (slower than widening).
add_test(NAME test_ops_bf16_capped COMMAND test_ops_bf16)
set_tests_properties(test_ops_bf16_capped PROPERTIES TIMEOUT 60 LABELS "unit;core"
                     ENVIRONMENT "MT_CPU_BF16_GEMM=auto;ONEDNN_MAX_CPU_ISA=AVX512_CORE"
                     FAIL_REGULAR_EXPRESSION "bf16 products: oneDNN")
