# topo: NVLink from hwloc's NVLinkBandwidth matrix, NVML probing through a fake libnvidia-ml, and
# GPU numbering by CUDA index.
set(MT_TOPO_FIXTURE_DIR "${CMAKE_SOURCE_DIR}/tests/fixtures/topologies")

mt_add_unit_test(test_topo_nvlink SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_topo_nvlink.c
                 TIMEOUT 60 LABELS topo)
target_compile_definitions(test_topo_nvlink PRIVATE MT_TOPO_FIXTURES="${MT_TOPO_FIXTURE_DIR}")

mt_add_unit_test(test_topo_cuda_order SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_topo_cuda_order.c
                 TIMEOUT 60 LABELS topo)
target_compile_definitions(test_topo_cuda_order PRIVATE MT_TOPO_FIXTURES="${MT_TOPO_FIXTURE_DIR}")

# The fake NVML, three ways: complete, as an NVML without nvmlDeviceGetNvLinkRemoteDeviceType, and
# without nvmlDeviceGetNvLinkRemotePciInfo_v2 (unusable). Loaded with dlopen, never linked.
foreach(variant fake_nvml fake_nvml_old fake_nvml_broken)
  add_library(${variant} MODULE ${CMAKE_CURRENT_LIST_DIR}/fake_nvml.c)
  target_compile_options(${variant} PRIVATE ${MT_C_WARNINGS})
  set_target_properties(${variant} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${MT_TEST_BIN})
endforeach()
target_compile_definitions(fake_nvml_old PRIVATE FAKE_NVML_NO_REMOTE_TYPE)
target_compile_definitions(fake_nvml_broken PRIVATE FAKE_NVML_NO_REMOTE_PCI)

# Leak detection is off as in test_topo_live: the test also runs live discovery, whose hwloc PCI
# plugin leaks and is unloaded before exit.
mt_add_unit_test(test_topo_nvml SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_topo_nvml.c
                 TIMEOUT 60 LABELS topo ENV ASAN_OPTIONS=detect_leaks=0)
add_dependencies(test_topo_nvml fake_nvml fake_nvml_old fake_nvml_broken)
target_compile_definitions(test_topo_nvml PRIVATE MT_TOPO_FIXTURES="${MT_TOPO_FIXTURE_DIR}"
                           FAKE_NVML="$<TARGET_FILE:fake_nvml>"
                           FAKE_NVML_OLD="$<TARGET_FILE:fake_nvml_old>"
                           FAKE_NVML_BROKEN="$<TARGET_FILE:fake_nvml_broken>")
