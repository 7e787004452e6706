# Broken plugins for the loader's error paths (tests/test_plugin_loader.cpp),
# written to build/tests/plugins as libshardplan_comm_<name>.so.
enable_language(C)
foreach(variant noentry:0 entryversion:1 abiversion:2 wrongkind:3)
  string(REPLACE ":" ";" parts ${variant})
  list(GET parts 0 name)
  list(GET parts 1 kind)
  add_library(test_plugin_${name} MODULE ${CMAKE_CURRENT_SOURCE_DIR}/plugins/bad_plugins.c)
  target_compile_definitions(test_plugin_${name} PRIVATE BAD_KIND=${kind})
  target_link_libraries(test_plugin_${name} PRIVATE shardplan::abi)
  set_target_properties(test_plugin_${name} PROPERTIES
    OUTPUT_NAME shardplan_comm_${name}
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/plugins)
  add_dependencies(shardplan_tests test_plugin_${name})
endforeach()
# A comm plugin whose static initialiser calls exit(0): the loader must turn
# that into a failure (tests/test_plugin_loader.cpp, faults.plugin_exits_on_load).
add_library(test_plugin_exits MODULE ${CMAKE_CURRENT_SOURCE_DIR}/plugins/exit_on_load.c)
target_link_libraries(test_plugin_exits PRIVATE shardplan::abi)
set_target_properties(test_plugin_exits PROPERTIES
  OUTPUT_NAME shardplan_comm_exits
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/plugins)
add_dependencies(shardplan_tests test_plugin_exits)
