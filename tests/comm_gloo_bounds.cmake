# No wait without a bound (issue 23, item 5). An emulated link so slow that
# an operation would outlast the timeout fails at issue, with threads and
# with processes under `shardplan launch --timeout-ms` (each collective used
# to sleep for hours on the worker while the caller waited without limit);
# a worker stuck in an operation (test hook SHARDPLAN_TEST_GLOO_STALL_MS, a
# sleep deaf to abort, 10 minutes) makes the waiting call time out, breaks
# the communicator, and the process still exits at once. TIMEOUT is far
# below both sleeps.
add_test(NAME comm_gloo_link_too_slow_threads
  COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_GLOO_LINK_GBPS=1e-9
    $<TARGET_FILE:comm_conformance> --backend gloo --threads 2 --quick --timeout-ms 2000)
add_test(NAME comm_gloo_link_too_slow_procs
  COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_GLOO_LINK_GBPS=1e-9
    $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo --timeout-ms 5000
    -- $<TARGET_FILE:comm_conformance> --backend gloo --quick)
set_tests_properties(comm_gloo_link_too_slow_threads PROPERTIES PASS_REGULAR_EXPRESSION
  "gloo all_reduce on rank [01] of 2: timed out: the emulated link of 1e-09 Gbit/s \\(option link_gbps, SHARDPLAN_GLOO_LINK_GBPS\\) needs [0-9.e+]+ s for this operation's [0-9]+ bytes, past the communicator's timeout of 2000 ms")
set_tests_properties(comm_gloo_link_too_slow_procs PROPERTIES PASS_REGULAR_EXPRESSION
  "gloo all_reduce on rank [01] of 2: timed out: the emulated link .* past the communicator's timeout of 5000 ms")
add_test(NAME comm_gloo_stuck_worker_times_out
  COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_TEST_GLOO_STALL_MS=600000
    $<TARGET_FILE:comm_conformance> --backend gloo --threads 2 --quick --timeout-ms 1000)
set_tests_properties(comm_gloo_stuck_worker_times_out PROPERTIES PASS_REGULAR_EXPRESSION
  "gloo all_reduce on rank [01] of 2: timed out: the worker has been running all_reduce for [0-9]+ ms, past the communicator's timeout of 1000 ms; the communicator is broken now.*the communicator is broken \\(timed out")
set_tests_properties(comm_gloo_link_too_slow_threads comm_gloo_link_too_slow_procs comm_gloo_stuck_worker_times_out
  PROPERTIES TIMEOUT 30 LABELS "comm;gloo;faults")
