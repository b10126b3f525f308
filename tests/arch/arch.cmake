# The architecture's rules, checked mechanically: folders depend one way (the order is the one
# docs/architecture.md states), and the shared library exports exactly the public API.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_test(NAME arch_layers
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_layers.py ${CMAKE_SOURCE_DIR})
add_test(NAME arch_layers_self_test
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_layers.py --self-test)
set_tests_properties(arch_layers arch_layers_self_test PROPERTIES LABELS "unit;arch" TIMEOUT 60)
add_test(NAME arch_exports
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_exports.py
                 $<TARGET_FILE:meshtrain> ${CMAKE_SOURCE_DIR}/include)
add_test(NAME arch_exports_self_test
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_exports.py --self-test)
set_tests_properties(arch_exports arch_exports_self_test PROPERTIES LABELS "unit;arch" TIMEOUT 60
                     ENVIRONMENT "CC=${CMAKE_C_COMPILER}")
