# gloo's shared-memory segments are never left in /dev/shm (issue 23, item 3):
# a full /dev/shm under shm=auto and shm=on, a peer killed inside the attach
# window (the plugin unlinks), and the segment's creator killed there under
# `shardplan launch` (the launcher removes its job's segments), and the
# launcher itself stopped by SIGTERM there; the launcher killed with SIGKILL
# there, and names whose creator is gone removed by the next launcher or
# rank (issue 33, item 4). Each case runs
# in a private mount namespace with a small tmpfs on /dev/shm and is skipped
# (exit 77) where user and mount namespaces are unavailable.
foreach(case full-auto full-on kill-peer kill-creator term-launch kill9-launch stale-launch stale-rank)
  add_test(NAME comm_gloo_shm_leftovers_${case}
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/e2e/gloo_shm_leftovers.sh ${case}
      $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:comm_conformance>)
  set_tests_properties(comm_gloo_shm_leftovers_${case} PROPERTIES
    TIMEOUT 120 LABELS "comm;gloo;faults" SKIP_RETURN_CODE 77)
endforeach()
