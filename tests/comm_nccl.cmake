# The nccl plugin's tests (tests/comm_nccl/), built only with the plugin. A
# torch-free program: the plugin through dlopen, the conformance suite on
# device memory, CUDA's runtime. GPU tests print "[  SKIPPED ]" with the
# reason on machines with too few CUDA devices (CI), which ctest reports as
# skipped; comm_nccl_plugin needs no GPU and always runs.
if(NOT TARGET shardplan_comm_nccl)
  return()
endif()

add_executable(comm_nccl_tests ${CMAKE_CURRENT_LIST_DIR}/comm_nccl/test_comm_nccl.cpp)
target_link_libraries(comm_nccl_tests PRIVATE
  shardplan_comm_conformance shardplan_cuda_nccl GTest::gtest GTest::gtest_main ${CMAKE_DL_LIBS})
target_compile_options(comm_nccl_tests PRIVATE -Wall -Wextra)
target_compile_definitions(comm_nccl_tests PRIVATE
  SHARDPLAN_NCCL_PLUGIN="$<TARGET_FILE:shardplan_comm_nccl>")
add_dependencies(comm_nccl_tests shardplan_comm_nccl)

add_test(NAME comm_nccl_plugin COMMAND comm_nccl_tests --gtest_filter=NcclPlugin.*)
add_test(NAME comm_nccl_ws1 COMMAND comm_nccl_tests --gtest_filter=NcclWorld1.*)
set(_nccl_gpu_tests comm_nccl_ws1)
foreach(np 2 3 4)
  add_test(NAME comm_nccl_procs_np${np}
    COMMAND $<TARGET_FILE:shardplan_cli> launch -n ${np} --backend nccl --timeout-ms 120000
      -- $<TARGET_FILE:comm_nccl_tests> --gtest_filter=NcclMultiRank.*)
  list(APPEND _nccl_gpu_tests comm_nccl_procs_np${np})
endforeach()
set_tests_properties(comm_nccl_plugin PROPERTIES TIMEOUT 120 LABELS "comm;nccl")
set_tests_properties(${_nccl_gpu_tests} PROPERTIES TIMEOUT 900 LABELS "comm;nccl"
  SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")

# Without a GPU the tests above only skip; this runs the world-size-1 ones
# against a stand-in for the CUDA runtime and NCCL (host memory, one rank),
# which checks the plugin's own logic on every machine.
add_library(comm_nccl_mock SHARED ${CMAKE_CURRENT_LIST_DIR}/comm_nccl/mock_cuda_nccl.cpp)
target_include_directories(comm_nccl_mock PRIVATE
  $<TARGET_PROPERTY:shardplan_cuda_nccl,INTERFACE_INCLUDE_DIRECTORIES>)
target_compile_options(comm_nccl_mock PRIVATE -Wall -Wextra -Wno-unused-parameter)
add_dependencies(comm_nccl_tests comm_nccl_mock)
set(_nccl_preload $<TARGET_FILE:comm_nccl_mock>)
# ASan refuses to start unless its runtime comes first in the library list,
# and a preloaded library comes before the program's own dependencies.
if(SHARDPLAN_SANITIZE MATCHES "address")
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libasan.so
    OUTPUT_VARIABLE _asan_rt OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(_nccl_preload "${_asan_rt}:${_nccl_preload}")
endif()
add_test(NAME comm_nccl_mock_ws1 COMMAND comm_nccl_tests --gtest_filter=NcclWorld1.*)
set_tests_properties(comm_nccl_mock_ws1 PROPERTIES TIMEOUT 600 LABELS "comm;nccl"
  ENVIRONMENT "LD_PRELOAD=${_nccl_preload}")
