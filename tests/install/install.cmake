# Installs this build into a temporary prefix and builds programs against it (CMake package and
# pkg-config). Runs alone: cmake --install and two small builds would compete for the 2 cores.
add_test(NAME install_consumer
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/install/run.sh ${CMAKE_BINARY_DIR}
                 ${CMAKE_SOURCE_DIR} ${CMAKE_C_COMPILER})
set_tests_properties(install_consumer PROPERTIES TIMEOUT 600 LABELS install
                     RESOURCE_LOCK mt_cores)

# MT_UCX_ROOT (cmake/ucx.cmake) against fake UCX roots, configure only: refusals, the configure
# report and what the generated pkg-config / CMake package files take from the root.
add_test(NAME ucx_root_configure
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/install/ucx_root.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(ucx_root_configure PROPERTIES TIMEOUT 300 LABELS install
                     RESOURCE_LOCK mt_cores)
