# The mpi backend's tests: the conformance suite at world sizes 1-4 started by
# mpirun directly and by `shardplan launch --backend mpi`, a stuck peer that
# must cost an error rather than a hang, MPI initialised by the host program,
# and the launcher's mpi mode.
# Without the plugin (no MPI found at configure time) there is nothing to
# test; without mpirun the tests are reported as skipped, not failed.
if(NOT TARGET shardplan_comm_mpi)
  return()
endif()

find_program(SHARDPLAN_MPIRUN NAMES mpirun mpiexec)
if(NOT SHARDPLAN_MPIRUN)
  add_test(NAME comm_mpi_skipped COMMAND ${CMAKE_COMMAND} -E echo "mpirun not found: mpi tests skipped")
  set_tests_properties(comm_mpi_skipped PROPERTIES LABELS "comm;mpi" SKIP_REGULAR_EXPRESSION "mpi tests skipped")
  return()
endif()

# Open MPI refuses root without both variables; CI containers run as root.
set(_mpi_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
# Ranks may outnumber the cores of the machine that runs the tests.
set(_mpirun ${SHARDPLAN_MPIRUN} --oversubscribe --bind-to none)

foreach(np 1 2 3 4)
  add_test(NAME comm_mpi_mpirun_np${np}
    COMMAND ${_mpirun} -np ${np} $<TARGET_FILE:comm_conformance> --backend mpi --timeout-ms 120000)
  add_test(NAME comm_mpi_launch_np${np}
    COMMAND $<TARGET_FILE:shardplan_cli> launch -n ${np} --backend mpi --timeout-ms 120000
      -- $<TARGET_FILE:comm_conformance>)
  set_tests_properties(comm_mpi_mpirun_np${np} PROPERTIES TIMEOUT 600 LABELS "comm;mpi" ENVIRONMENT "${_mpi_env}")
  # The launcher sets Open MPI's root variables itself.
  set_tests_properties(comm_mpi_launch_np${np} PROPERTIES TIMEOUT 600 LABELS "comm;mpi")
endforeach()

add_executable(mpi_dead_peer ${CMAKE_CURRENT_LIST_DIR}/comm_mpi/mpi_dead_peer.cpp)
target_link_libraries(mpi_dead_peer PRIVATE shardplan::abi ${CMAKE_DL_LIBS})
set_target_properties(mpi_dead_peer PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
add_dependencies(mpi_dead_peer shardplan_comm_mpi)
# The stuck ranks sleep 100 s, so only a hang reaches the 90 s timeout. The
# job's exit status is mpirun's verdict on a rank that skipped MPI_Finalize
# (see the program), hence the pass expression instead of the status.
add_test(NAME comm_mpi_dead_peer
  COMMAND ${_mpirun} -np 3 $<TARGET_FILE:mpi_dead_peer> $<TARGET_FILE:shardplan_comm_mpi>)
add_test(NAME comm_mpi_dead_peer_launch
  COMMAND $<TARGET_FILE:shardplan_cli> launch -n 2 --backend mpi
    -- $<TARGET_FILE:mpi_dead_peer> $<TARGET_FILE:shardplan_comm_mpi>)
set_tests_properties(comm_mpi_dead_peer comm_mpi_dead_peer_launch PROPERTIES
  TIMEOUT 90 LABELS "comm;mpi"
  PASS_REGULAR_EXPRESSION "mpi_dead_peer: rank 0: PASS" FAIL_REGULAR_EXPRESSION "FAIL")
set_tests_properties(comm_mpi_dead_peer PROPERTIES ENVIRONMENT "${_mpi_env}")

# MPI initialised by the host: at MPI_THREAD_SERIALIZED the plugin serialises
# its calls and must pass the suite; at MPI_THREAD_FUNNELED it must refuse.
set(MPI_CXX_SKIP_MPICXX ON)
find_package(MPI COMPONENTS CXX QUIET)
add_executable(mpi_host_init ${CMAKE_CURRENT_LIST_DIR}/comm_mpi/mpi_host_init.cpp)
target_link_libraries(mpi_host_init PRIVATE shardplan_comm_conformance MPI::MPI_CXX ${CMAKE_DL_LIBS})
set_target_properties(mpi_host_init PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
add_dependencies(mpi_host_init shardplan_comm_mpi)
foreach(level serialized funneled)
  add_test(NAME comm_mpi_host_init_${level}
    COMMAND ${_mpirun} -np 3 $<TARGET_FILE:mpi_host_init> ${level} $<TARGET_FILE:shardplan_comm_mpi>)
  set_tests_properties(comm_mpi_host_init_${level} PROPERTIES
    TIMEOUT 600 LABELS "comm;mpi" ENVIRONMENT "${_mpi_env}" PASS_REGULAR_EXPRESSION "mpi_host_init: PASS"
    FAIL_REGULAR_EXPRESSION "FAIL")
endforeach()

# The launcher's mpi mode with launcher_probe as the ranks.
find_program(SHARDPLAN_BASH bash REQUIRED)
foreach(case env prefix_many_lines partial_line fail_fast forward_sigterm multi_node_refused restarts)
  add_test(NAME launcher.mpi_${case}
    COMMAND ${SHARDPLAN_BASH} ${CMAKE_CURRENT_LIST_DIR}/comm_mpi/launch_mpi_test.sh
      $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:launcher_probe> ${case})
  set_tests_properties(launcher.mpi_${case} PROPERTIES TIMEOUT 120 LABELS "comm;mpi;launcher")
endforeach()

# bench_comm_mpi checks both sides' sums before it times them.
if(SHARDPLAN_BUILD_BENCHMARKS)
  add_test(NAME bench_comm_mpi_smoke
    COMMAND ${_mpirun} -np 2 $<TARGET_FILE:bench_comm_mpi> --min-bytes 4 --max-bytes 4096)
  set_tests_properties(bench_comm_mpi_smoke PROPERTIES
    TIMEOUT 120 LABELS "comm;mpi;bench" ENVIRONMENT "${_mpi_env}" PASS_REGULAR_EXPRESSION "4 KiB +20")
endif()
