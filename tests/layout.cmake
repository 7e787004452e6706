# The tree keeps the shape docs/ARCHITECTURE.md describes: includes point
# down the kernel's layers, and the check itself catches a planted violation.
find_program(SHARDPLAN_LAYOUT_PYTHON3 python3)
if(SHARDPLAN_LAYOUT_PYTHON3)
  add_test(NAME layers_include_direction
    COMMAND ${SHARDPLAN_LAYOUT_PYTHON3} ${PROJECT_SOURCE_DIR}/scripts/check_layers.py --root ${PROJECT_SOURCE_DIR})
  add_test(NAME layers_check_catches_violation
    COMMAND ${SHARDPLAN_LAYOUT_PYTHON3} ${PROJECT_SOURCE_DIR}/scripts/check_layers.py --root ${PROJECT_SOURCE_DIR} --self-test)
  set_tests_properties(layers_include_direction layers_check_catches_violation PROPERTIES TIMEOUT 60 LABELS layout)
endif()
