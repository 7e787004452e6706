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

# Blocking calls run on each communicator's worker by default; the inline
# path (option blocking=inline) gets the same suite, and a bad value of the
# option is refused at create.
add_test(NAME comm_gloo_threads_ws2_inline
  COMMAND comm_conformance --backend gloo --threads 2 --option blocking=inline)
add_test(NAME comm_gloo_procs_np2_inline
  COMMAND $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo --timeout-ms 120000
    -- $<TARGET_FILE:comm_conformance> --backend gloo --option blocking=inline)
add_test(NAME comm_gloo_bad_blocking_option
  COMMAND comm_conformance --backend gloo --threads 1 --option blocking=fast)
set_tests_properties(comm_gloo_threads_ws2_inline comm_gloo_procs_np2_inline PROPERTIES TIMEOUT 300 LABELS "comm;gloo")
set_tests_properties(comm_gloo_bad_blocking_option PROPERTIES TIMEOUT 60 LABELS "comm;gloo"
  PASS_REGULAR_EXPRESSION "bad option blocking=fast \\(expected blocking=worker or blocking=inline\\)")

# Ranks on one host move all_reduce, reduce_scatter and all_gather through
# shared memory by default (plugins/comm_gloo/shm.h). shm=on makes that an
# error when it cannot be done, so these runs prove the suite went through
# it; shm=off keeps gloo's TCP path under the same suite. No segment may be
# left behind in /dev/shm.
add_test(NAME comm_gloo_threads_ws3_shm_on COMMAND comm_conformance --backend gloo --threads 3 --option shm=on)
add_test(NAME comm_gloo_procs_np2_shm_on
  COMMAND $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo --timeout-ms 120000
    -- $<TARGET_FILE:comm_conformance> --backend gloo --option shm=on)
add_test(NAME comm_gloo_threads_ws3_shm_off COMMAND comm_conformance --backend gloo --threads 3 --option shm=off)
add_test(NAME comm_gloo_procs_np2_shm_off
  COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_GLOO_SHM=off
    $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo --timeout-ms 120000
    -- $<TARGET_FILE:comm_conformance> --backend gloo)
add_test(NAME comm_gloo_bad_shm_option
  COMMAND comm_conformance --backend gloo --threads 2 --option shm=fast)
set_tests_properties(comm_gloo_threads_ws3_shm_on comm_gloo_procs_np2_shm_on comm_gloo_threads_ws3_shm_off
  comm_gloo_procs_np2_shm_off PROPERTIES TIMEOUT 300 LABELS "comm;gloo")
set_tests_properties(comm_gloo_bad_shm_option PROPERTIES TIMEOUT 60 LABELS "comm;gloo"
  PASS_REGULAR_EXPRESSION "bad option shm=fast \\(expected shm=auto, shm=on or shm=off\\)")

# Over TCP, 2 ranks all_reduce by one pipelined exchange instead of gloo's
# ring (plugins/comm_gloo/tcp_all_reduce.h; bit for bit the ring's results in
# test_comm_gloo.cpp); tcp_all_reduce=ring keeps the ring under the suite.
add_test(NAME comm_gloo_threads_ws2_shm_off COMMAND comm_conformance --backend gloo --threads 2 --option shm=off)
add_test(NAME comm_gloo_threads_ws2_tcp_ring
  COMMAND comm_conformance --backend gloo --threads 2 --option shm=off --option tcp_all_reduce=ring)
add_test(NAME comm_gloo_bad_tcp_all_reduce_option
  COMMAND comm_conformance --backend gloo --threads 1 --option tcp_all_reduce=fast)
set_tests_properties(comm_gloo_threads_ws2_shm_off comm_gloo_threads_ws2_tcp_ring PROPERTIES TIMEOUT 300 LABELS "comm;gloo")
set_tests_properties(comm_gloo_bad_tcp_all_reduce_option PROPERTIES TIMEOUT 60 LABELS "comm;gloo"
  PASS_REGULAR_EXPRESSION "bad option tcp_all_reduce=fast \\(expected tcp_all_reduce=auto or tcp_all_reduce=ring\\)")

# A rank waiting for a collective polls before it sleeps (spin_us=, by
# default while the host has a core per rank: comm_gloo.cpp default_spin_us).
# The suite runs with polling forced on more ranks than cores, and with none
# (every wait asleep at once, the plugin before 2026-11-28's evening) over
# TCP between processes; values that are not microseconds are refused.
add_test(NAME comm_gloo_threads_ws3_spin
  COMMAND comm_conformance --backend gloo --threads 3 --option shm=off --option spin_us=1000000)
add_test(NAME comm_gloo_procs_np2_no_spin
  COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_GLOO_SHM=off SHARDPLAN_GLOO_SPIN_US=0
    $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo --timeout-ms 120000
    -- $<TARGET_FILE:comm_conformance> --backend gloo)
add_test(NAME comm_gloo_bad_spin_option
  COMMAND comm_conformance --backend gloo --threads 1 --option spin_us=5ms)
set_tests_properties(comm_gloo_threads_ws3_spin comm_gloo_procs_np2_no_spin PROPERTIES TIMEOUT 300 LABELS "comm;gloo")
set_tests_properties(comm_gloo_bad_spin_option PROPERTIES TIMEOUT 60 LABELS "comm;gloo"
  PASS_REGULAR_EXPRESSION "bad option spin_us=5ms \\(expected a number of microseconds from 0 to 1000000\\)")

# The emulated link (link_gbps=, SHARDPLAN_GLOO_LINK_GBPS) refuses what is not
# a rate; its pacing is tested in test_comm_gloo.cpp.
add_test(NAME comm_gloo_bad_link_option
  COMMAND comm_conformance --backend gloo --threads 1 --option link_gbps=fast)
set_tests_properties(comm_gloo_bad_link_option PROPERTIES TIMEOUT 60 LABELS "comm;gloo"
  PASS_REGULAR_EXPRESSION "bad option link_gbps=fast \\(expected a number of Gbit/s > 0, or 0 for no emulated link\\)")

# Each variable of docs/ENVIRONMENT.md is refused at create like its option,
# naming the variable, its value and what it accepts (a typo used to be
# ignored silently).
add_test(NAME comm_gloo_bad_link_env
  COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_GLOO_LINK_GBPS=-1 $<TARGET_FILE:comm_conformance> --backend gloo --threads 1)
add_test(NAME comm_gloo_bad_tcp_all_reduce_env
  COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_GLOO_TCP_ALL_REDUCE=fast $<TARGET_FILE:comm_conformance> --backend gloo --threads 2)
add_test(NAME comm_gloo_bad_shm_env
  COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_GLOO_SHM=of $<TARGET_FILE:comm_conformance> --backend gloo --threads 2)
add_test(NAME comm_gloo_bad_job_id_env
  COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_JOB_ID=a/b $<TARGET_FILE:comm_conformance> --backend gloo --threads 2)
add_test(NAME comm_gloo_bad_verbose_env
  COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_GLOO_VERBOSE=yes $<TARGET_FILE:comm_conformance> --backend gloo --threads 2)
add_test(NAME comm_gloo_bad_shm_pause_env
  COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_TEST_GLOO_SHM_PAUSE_MS=x $<TARGET_FILE:comm_conformance> --backend gloo --threads 2)
add_test(NAME comm_gloo_bad_stall_env
  COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_TEST_GLOO_STALL_MS=1s $<TARGET_FILE:comm_conformance> --backend gloo --threads 2)
add_test(NAME comm_gloo_bad_spin_env
  COMMAND ${CMAKE_COMMAND} -E env SHARDPLAN_GLOO_SPIN_US=2000000 $<TARGET_FILE:comm_conformance> --backend gloo --threads 2)
set_tests_properties(comm_gloo_bad_spin_env PROPERTIES TIMEOUT 60 LABELS "comm;gloo" PASS_REGULAR_EXPRESSION
  "SHARDPLAN_GLOO_SPIN_US='2000000' is not a number of microseconds \\(a whole number from 0 to 1000000, as option spin_us=\\)")
set_tests_properties(comm_gloo_bad_tcp_all_reduce_env comm_gloo_bad_link_env comm_gloo_bad_shm_env comm_gloo_bad_job_id_env comm_gloo_bad_shm_pause_env
  comm_gloo_bad_stall_env comm_gloo_bad_verbose_env PROPERTIES
  TIMEOUT 60 LABELS "comm;gloo")
set_tests_properties(comm_gloo_bad_link_env PROPERTIES PASS_REGULAR_EXPRESSION
  "SHARDPLAN_GLOO_LINK_GBPS='-1' is not a link rate \\(a number of Gbit/s > 0, or 0 for no emulated link\\)")
set_tests_properties(comm_gloo_bad_tcp_all_reduce_env PROPERTIES PASS_REGULAR_EXPRESSION
  "SHARDPLAN_GLOO_TCP_ALL_REDUCE='fast' is not auto or ring \\(as option tcp_all_reduce=\\)")
set_tests_properties(comm_gloo_bad_shm_env PROPERTIES PASS_REGULAR_EXPRESSION
  "SHARDPLAN_GLOO_SHM='of' is not one of: auto, on, off, 1, 0, true, false \\(as option shm=\\)")
set_tests_properties(comm_gloo_bad_job_id_env PROPERTIES PASS_REGULAR_EXPRESSION
  "SHARDPLAN_JOB_ID='a/b' is not a job id \\(1 to 24 letters, digits")
set_tests_properties(comm_gloo_bad_verbose_env PROPERTIES PASS_REGULAR_EXPRESSION
  "SHARDPLAN_GLOO_VERBOSE='yes' is not 0 or 1")
set_tests_properties(comm_gloo_bad_shm_pause_env PROPERTIES PASS_REGULAR_EXPRESSION
  "SHARDPLAN_TEST_GLOO_SHM_PAUSE_MS='x' is not a number of milliseconds \\(a whole number from 0 to 3600000\\)")
set_tests_properties(comm_gloo_bad_stall_env PROPERTIES PASS_REGULAR_EXPRESSION
  "SHARDPLAN_TEST_GLOO_STALL_MS='1s' is not a number of milliseconds \\(a whole number from 0 to 3600000\\)")

find_program(SHARDPLAN_BASH bash REQUIRED)
add_test(NAME comm_gloo_shm_no_leftovers
  COMMAND ${SHARDPLAN_BASH} -c "\"$1\" --backend gloo --threads 4 --quick --option shm=on >/dev/null & pid=$!; wait $pid || exit 1; left=$(ls /dev/shm | grep \"^shardplan-gloo-nojob-$pid-\"); [ -z \"$left\" ] || { echo \"left in /dev/shm: $left\"; exit 1; }" _ $<TARGET_FILE:comm_conformance>)
set_tests_properties(comm_gloo_shm_no_leftovers PROPERTIES TIMEOUT 300 LABELS "comm;gloo")
# tests/e2e/two_nodes_gloo.sh picks a free port with launcher_probe.
add_test(NAME comm_gloo_two_nodes
  COMMAND ${SHARDPLAN_BASH} ${CMAKE_CURRENT_LIST_DIR}/e2e/two_nodes_gloo.sh $<TARGET_FILE:shardplan_cli>
    $<TARGET_FILE:launcher_probe> 2 -- $<TARGET_FILE:comm_conformance> --backend gloo --quick --timeout-ms 120000)
set_tests_properties(comm_gloo_two_nodes PROPERTIES TIMEOUT 600 LABELS "comm;gloo")

# bench_comm_gloo checks both sides' sums before it times them; 3 ranks.
if(SHARDPLAN_BUILD_BENCHMARKS)
  add_test(NAME bench_comm_gloo_smoke COMMAND $<TARGET_FILE:bench_comm_gloo> --ranks 3 --max-bytes 4096)
  set_tests_properties(bench_comm_gloo_smoke PROPERTIES
    TIMEOUT 120 LABELS "comm;gloo;bench" PASS_REGULAR_EXPRESSION "4 KiB +20")
endif()
