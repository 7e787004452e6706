# Shared by the install-tree tests' ctest drivers (consumer/run.cmake,
# lora_plugin/run.cmake): installs the build tree BIN into WORK/prefix, then
# configures and builds the project SRC in WORK/build against it with
# find_package(shardplan), as a user outside the tree would.
function(build_against_install BIN SRC WORK LAUNCHER SANITIZE)
  file(REMOVE_RECURSE ${WORK})
  execute_process(COMMAND ${CMAKE_COMMAND} --install ${BIN} --prefix ${WORK}/prefix
    RESULT_VARIABLE rc OUTPUT_QUIET)
  if(rc)
    message(FATAL_ERROR "cmake --install failed: ${rc}")
  endif()
  # A sanitized libshardplan needs the sanitizer runtime first in the
  # project's library list, so it is built with the same flags.
  set(flags "")
  if(SANITIZE)
    set(flags "-DCMAKE_CXX_FLAGS=-fsanitize=${SANITIZE}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${WORK}/build -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${WORK}/prefix -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER} ${flags} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "configuring ${SRC} failed: ${rc}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK}/build -j2 RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "building ${SRC} failed: ${rc}")
  endif()
endfunction()
