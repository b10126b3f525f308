# Installs this build into a temporary prefix and builds programs against it (CMake package and
# pkg-config). Runs alone: cmake --install and two small builds would compete for the 2 cores.
add_test(NAME install_consumer
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/install/run.sh ${CMAKE_BINARY_DIR}
                 ${CMAKE_SOURCE_DIR} ${CMAKE_C_COMPILER})
set_tests_properties(install_consumer PROPERTIES TIMEOUT 600 LABELS install
                     RESOURCE_LOCK mt_cores)
