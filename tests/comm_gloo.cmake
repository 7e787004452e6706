# The gloo backend's conformance. Ranks as threads (memory store), ranks as
# real processes started by `shardplan launch` (the launcher's file store),
# and two "nodes" on loopback addresses meeting at rank 0's TCP store.
foreach(ws 1 2 3 4)
  add_test(NAME comm_gloo_threads_ws${ws} COMMAND comm_conformance --backend gloo --threads ${ws})
  set_tests_properties(comm_gloo_threads_ws${ws} PROPERTIES TIMEOUT 300 LABELS "comm;gloo")
endforeach()

foreach(np 2 3 4)
  add_test(NAME comm_gloo_procs_np${np}
    COMMAND $<TARGET_FILE:shardplan_cli> launch -n ${np} --backend gloo --timeout-ms 120000
      -- $<TARGET_FILE:comm_conformance> --backend gloo)
  set_tests_properties(comm_gloo_procs_np${np} PROPERTIES TIMEOUT 600 LABELS "comm;gloo")
endforeach()

find_program(SHARDPLAN_BASH bash REQUIRED)
# A fixed port: two launchers cannot agree on a random one. The lock keeps
# parallel ctest runs of this file from colliding on it.
set(SHARDPLAN_GLOO_TEST_PORT 29631 CACHE STRING "TCP store port of the comm_gloo_two_nodes test")
add_test(NAME comm_gloo_two_nodes
  COMMAND ${SHARDPLAN_BASH} ${CMAKE_CURRENT_LIST_DIR}/launcher/two_nodes.sh $<TARGET_FILE:shardplan_cli> 2
    ${SHARDPLAN_GLOO_TEST_PORT} --backend gloo --timeout-ms 120000
    -- $<TARGET_FILE:comm_conformance> --backend gloo --quick)
set_tests_properties(comm_gloo_two_nodes PROPERTIES TIMEOUT 600 LABELS "comm;gloo"
  RESOURCE_LOCK shardplan_gloo_test_port)
