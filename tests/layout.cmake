# The tree keeps the shape docs/ARCHITECTURE.md describes: includes point
# down the kernel's layers (and the check itself catches a planted
# violation), and no file of framework/, plugins/, tools/ is over 600 lines.
find_program(SHARDPLAN_LAYOUT_PYTHON3 python3)
if(SHARDPLAN_LAYOUT_PYTHON3)
  add_test(NAME layers_include_direction
    COMMAND ${SHARDPLAN_LAYOUT_PYTHON3} ${PROJECT_SOURCE_DIR}/scripts/check_layers.py --root ${PROJECT_SOURCE_DIR})
  add_test(NAME layers_check_catches_violation
    COMMAND ${SHARDPLAN_LAYOUT_PYTHON3} ${PROJECT_SOURCE_DIR}/scripts/check_layers.py --root ${PROJECT_SOURCE_DIR} --self-test)
  set_tests_properties(layers_include_direction layers_check_catches_violation PROPERTIES TIMEOUT 60 LABELS layout)
endif()
# No file of the kernel, the plugins or the tools over 600 lines (one concept a file).
add_test(NAME layout_file_sizes COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/check_file_sizes.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(layout_file_sizes PROPERTIES TIMEOUT 60 LABELS layout)
# Every unit-test file in its own namespace, which the unity build needs.
add_test(NAME layout_test_namespaces COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/check_test_namespaces.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(layout_test_namespaces PROPERTIES TIMEOUT 60 LABELS layout)
