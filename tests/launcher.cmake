# Tests of `shardplan launch` (tools/shardplan): bash scripts driving the real
# launcher binary with launcher_probe as the ranks. Torch-free, like the launcher.
add_executable(launcher_probe ${CMAKE_CURRENT_LIST_DIR}/launcher/launcher_probe.cpp)
# Not in bin/: that folder mirrors the install tree and the probe is not installed.
set_target_properties(launcher_probe PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})

find_program(SHARDPLAN_BASH bash REQUIRED)
set(_launcher_cases
  help usage_errors env_single_node env_options env_node_rank two_nodes_env two_nodes_failure
  prefix_many_lines partial_line all_zero fail_fast killed_by_signal sigkill_escalation
  leftover_descendants forward_sigterm forward_sigint exec_failure thread_env restart_limit
  signal_in_stop_sigterm signal_in_stop_sigint signal_after_ranks)
foreach(case ${_launcher_cases})
  add_test(NAME launcher.${case}
    COMMAND ${SHARDPLAN_BASH} ${CMAKE_CURRENT_LIST_DIR}/launcher/launcher_test.sh
      $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:launcher_probe> ${case})
  set_tests_properties(launcher.${case} PROPERTIES TIMEOUT 120 LABELS launcher)
endforeach()
