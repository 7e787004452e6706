# ctest driver: install the build tree into a scratch prefix, then configure,
# build and run tests/consumer against it with find_package(shardplan).
include(${CMAKE_CURRENT_LIST_DIR}/build_against_install.cmake)
build_against_install(${BIN} ${SRC} ${WORK} "${LAUNCHER}" "${SANITIZE}")
foreach(program consumer consumer_ddp_loop)
  execute_process(COMMAND ${WORK}/build/${program} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "${program} failed: ${rc}")
  endif()
endforeach()
# Two gloo processes started by the installed launcher, as a user runs them.
execute_process(COMMAND ${WORK}/prefix/bin/shardplan launch -n 2 --backend gloo --timeout-ms 60000
  -- ${WORK}/build/consumer_clip_loop RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "consumer_clip_loop under shardplan launch -n 2 --backend gloo failed: ${rc}")
endif()
