# Several hosts for real (tests/hosts): network namespaces on a bridge of
# their own stand for hosts, so the nodes of a job meet over a real link
# (veth, optionally shaped with tc tbf) that a test can cut. Every case needs
# root and `ip netns`; where those are missing it is skipped (status 77).
find_program(SHARDPLAN_BASH bash REQUIRED)
set(_hosts ${CMAKE_CURRENT_SOURCE_DIR}/hosts)
foreach(case reach rate cleanup)
  add_test(NAME hosts.fixture_${case} COMMAND ${SHARDPLAN_BASH} ${_hosts}/fixture_test.sh ${case})
endforeach()
# 2 hosts x 2 ranks against one process: plans/gpt.yaml splits the model over
# all four ranks, across the link; gpt_2d.yaml's {data: 2, model: 2} keeps the
# model axis within a host and puts the data axis across.
foreach(plan gpt gpt_2d)
  add_test(NAME hosts.e2e_${plan} COMMAND ${SHARDPLAN_BASH} ${_hosts}/e2e_test.sh
    $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:train_model> ${PROJECT_SOURCE_DIR}/plans/${plan}.yaml)
endforeach()
# A cable cut mid-training, a flap, the master's host gone at the rendezvous,
# a rank killed under --max-restarts, and restarts coordinated between the
# launchers (tests/hosts/link_faults.sh).
foreach(case link_down link_flap master_gone restart_across restart_together)
  add_test(NAME hosts.${case} COMMAND ${SHARDPLAN_BASH} ${_hosts}/link_faults.sh ${case}
    $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:train_model> ${PROJECT_SOURCE_DIR})
endforeach()
# benchmarks/dp_step/real_link.sh as a smoke check, not a measurement: a tiny
# GPT, one round, the data axis across a 2 Gbit/s tbf link; --check 1 fails
# unless the bytes on the sockets are the ring's (about 15 s).
if(SHARDPLAN_BUILD_BENCHMARKS AND SHARDPLAN_BUILD_EXAMPLES)
  add_test(NAME hosts.dp_real_link_smoke COMMAND ${SHARDPLAN_BASH} ${PROJECT_SOURCE_DIR}/benchmarks/dp_step/real_link.sh
    ${CMAKE_BINARY_DIR} -- --config embed=32,heads=2,layers=1,mlp=64,context=16 --rounds 1 --bucket-mb 0.01 --check 1)
  set_tests_properties(hosts.dp_real_link_smoke PROPERTIES ENVIRONMENT "REAL_LINK_RUNS=2:4;REAL_LINK_KINDS=real")
endif()
get_property(_hosts_tests DIRECTORY PROPERTY TESTS)
list(FILTER _hosts_tests INCLUDE REGEX "^hosts\\.")
set_tests_properties(${_hosts_tests} PROPERTIES TIMEOUT 120 LABELS hosts SKIP_RETURN_CODE 77)
