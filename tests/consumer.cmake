# The consumer gets plain ccache as its launcher (ours is a list with an env
# wrapper, which would not survive being passed as one -D value).
set(_consumer_launcher "")
if(CCACHE_PROGRAM)
  set(_consumer_launcher ${CCACHE_PROGRAM})
endif()
add_test(NAME install_consumer COMMAND ${CMAKE_COMMAND}
  -DBIN=${PROJECT_BINARY_DIR} -DSRC=${CMAKE_CURRENT_SOURCE_DIR}/consumer
  -DWORK=${CMAKE_CURRENT_BINARY_DIR}/consumer_work -DLAUNCHER=${_consumer_launcher} "-DSANITIZE=${SHARDPLAN_SANITIZE}"
  -P ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run.cmake)
set_tests_properties(install_consumer PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)
# The out-of-tree layer plugin example (examples/plugins/lora,
# docs/WRITING_PLUGINS.md) built the same way and loaded by plans: LoRA under
# tensor parallelism at 2 and 4 thread ranks against one process.
add_test(NAME lora_plugin_out_of_tree COMMAND ${CMAKE_COMMAND}
  -DBIN=${PROJECT_BINARY_DIR} -DSRC=${PROJECT_SOURCE_DIR}/examples/plugins/lora
  -DWORK=${CMAKE_CURRENT_BINARY_DIR}/lora_plugin_work -DLAUNCHER=${_consumer_launcher} "-DSANITIZE=${SHARDPLAN_SANITIZE}"
  -P ${CMAKE_CURRENT_SOURCE_DIR}/lora_plugin/run.cmake)
set_tests_properties(lora_plugin_out_of_tree PROPERTIES TIMEOUT 900 RUN_SERIAL TRUE)
