# ctest driver for the out-of-tree layer plugin example (examples/plugins/lora,
# docs/WRITING_PLUGINS.md): builds it against the installed package, then
# runs its checks (lora_check.cpp: one mode per process, since a loaded
# plugin stays loaded) and the example program. Plans load the plugin from
# their `plugins:` folder, so SHARDPLAN_PLAN_PLUGINS=1 and no plugin path.
include(${CMAKE_CURRENT_LIST_DIR}/../consumer/build_against_install.cmake)
build_against_install(${BIN} ${SRC} ${WORK} "${LAUNCHER}" "${SANITIZE}")
set(build ${WORK}/build)
file(MAKE_DIRECTORY ${WORK}/empty)
set(env ${CMAKE_COMMAND} -E env --unset=SHARDPLAN_PLUGIN_PATH SHARDPLAN_PLAN_PLUGINS=1)
# One command line per entry, its words joined by '|' (a ';' would flatten
# the list of lists).
set(runs
  "lora_check|parity|lora.yaml"
  "lora_check|parity|lora_gathered.yaml"
  "lora_check|parity|lora_sp.yaml|sp"
  "lora_check|missing|${WORK}/empty"
  "lora_check|rank|lora.yaml"
  "lora_finetune|lora.yaml|2|50")
foreach(line IN LISTS runs)
  string(REPLACE "|" ";" run "${line}")
  string(REPLACE "|" " " shown "${line}")
  list(POP_FRONT run program)
  execute_process(COMMAND ${env} ${build}/${program} ${run} WORKING_DIRECTORY ${build}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${shown}:\n${out}${err}")
  if(rc)
    message(FATAL_ERROR "${shown} failed: ${rc}")
  endif()
endforeach()
if(NOT out MATCHES "saved 4 adapter tensors")
  message(FATAL_ERROR "lora_finetune did not save the 4 adapters")
endif()
