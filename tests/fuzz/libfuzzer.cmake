# libFuzzer executables of the harnesses in this directory, for long runs (scripts/fuzz); ctest
# runs the same harnesses with their built-in drivers (tests/fuzz/topo_fuzz.cmake, store_fuzz.cmake,
# safetensors_fuzz.cmake). A harness whose code is outside the library names its sources in
# MT_FUZZ_SOURCES_<harness>.
set(MT_FUZZ_SOURCES_fuzz_safetensors ${CMAKE_SOURCE_DIR}/tools/mt-ckpt/safetensors.c)
if(MT_LIBFUZZER)
  foreach(harness fuzz_store_frame fuzz_store_server fuzz_topo_nccl fuzz_topo_hwloc fuzz_safetensors)
    add_executable(${harness}_libfuzzer ${CMAKE_CURRENT_LIST_DIR}/${harness}.c
                   ${MT_FUZZ_SOURCES_${harness}})
    set_target_properties(${harness}_libfuzzer PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${MT_TEST_BIN})
    target_link_libraries(${harness}_libfuzzer PRIVATE meshtrain_internal)
    target_include_directories(${harness}_libfuzzer PRIVATE ${CMAKE_SOURCE_DIR}/tests)
    target_compile_definitions(${harness}_libfuzzer PRIVATE MT_FUZZ_LIBFUZZER)
    target_link_options(${harness}_libfuzzer PRIVATE -fsanitize=fuzzer)
  endforeach()
endif()
