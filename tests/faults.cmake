# Runtime faults through `shardplan launch` with real processes
# (tests/faults/faults_test.sh, one ctest case each): a collective one rank
# skips, a rank killed mid-training, ranks that disagree on the plan or the
# model, rendezvous that cannot happen, and plugins that must be refused.
# Every case runs with timeouts of a few seconds.
add_executable(fault_probe ${CMAKE_CURRENT_LIST_DIR}/faults/fault_probe.cpp)
target_link_libraries(fault_probe PRIVATE shardplan::shardplan)
set_target_properties(fault_probe PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
add_dependencies(fault_probe shardplan_plugins)

# Broken layer plugins, each alone in a folder a plan's `plugins:` can name
# (a folder is scanned for every libshardplan_layer_*.so in it).
enable_language(C)
foreach(variant noentry:0 layerabi:4)
  string(REPLACE ":" ";" parts ${variant})
  list(GET parts 0 name)
  list(GET parts 1 kind)
  add_library(test_layer_plugin_${name} MODULE ${CMAKE_CURRENT_SOURCE_DIR}/plugins/bad_plugins.c)
  target_compile_definitions(test_layer_plugin_${name} PRIVATE BAD_KIND=${kind})
  target_link_libraries(test_layer_plugin_${name} PRIVATE shardplan::abi)
  set_target_properties(test_layer_plugin_${name} PROPERTIES
    OUTPUT_NAME shardplan_layer_${name}
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/faults/layer_${name})
  add_dependencies(fault_probe test_layer_plugin_${name})
endforeach()
# The bad comm plugins of tests/plugins.cmake are used too.
foreach(name noentry abiversion exits)
  add_dependencies(fault_probe test_plugin_${name})
endforeach()

find_program(SHARDPLAN_BASH bash REQUIRED)
set(_fault_cases
  collective_timeout collective_timeout_group rank_killed rank_killed_two_nodes
  model_mismatch plan_mismatch rendezvous_timeout rendezvous_timeout_file port_in_use unreachable_master loopback_master_name
  comm_plugin_abi comm_plugin_no_entry layer_plugin_abi layer_plugin_no_entry plugin_search_path
  plan_plugins_need_opt_in plan_plugins_missing_dir plugin_by_path plugin_exits_on_load world_size_mismatch)
if(TARGET shardplan_comm_mpi AND SHARDPLAN_MPIRUN)
  list(APPEND _fault_cases collective_timeout_mpi rank_killed_mpi)
endif()
foreach(case ${_fault_cases})
  add_test(NAME faults.${case}
    COMMAND ${SHARDPLAN_BASH} ${CMAKE_CURRENT_LIST_DIR}/faults/faults_test.sh
      $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:fault_probe> $<TARGET_FILE:launcher_probe>
      $<TARGET_FILE:train_model> ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR} ${case})
  set_tests_properties(faults.${case} PROPERTIES TIMEOUT 120 LABELS faults SKIP_RETURN_CODE 77)
endforeach()
