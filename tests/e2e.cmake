# The example end to end: sharded runs give the unsharded run's losses.
set(_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh)
set(_mlp $<TARGET_FILE:train_mlp> --steps 20 --plan ${PROJECT_SOURCE_DIR}/plans/mlp.yaml)
set(_mlp_ref $<TARGET_FILE:train_mlp> --steps 20)
add_test(NAME e2e_mlp_threads_f64 COMMAND ${_e2e} 1e-10 -- ${_mlp_ref} --dtype float64 -- ${_mlp} --dtype float64 --ranks 2)
add_test(NAME e2e_mlp_threads4_f32 COMMAND ${_e2e} 1e-5 -- ${_mlp_ref} -- ${_mlp} --ranks 4)
add_test(NAME e2e_mlp_gloo_launcher COMMAND ${_e2e} 1e-5 -- ${_mlp_ref}
  -- $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo -- ${_mlp})
# Two launchers as two nodes (ranks of node 1 on 127.0.0.2) form one 4-rank
# gloo job through the TCP store on a free port.
add_test(NAME e2e_mlp_gloo_two_nodes COMMAND ${_e2e} 1e-5 -- ${_mlp_ref}
  -- ${CMAKE_CURRENT_SOURCE_DIR}/e2e/two_nodes_gloo.sh $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:launcher_probe> 2
  -- ${_mlp})
set_tests_properties(e2e_mlp_threads_f64 e2e_mlp_threads4_f32 e2e_mlp_gloo_launcher e2e_mlp_gloo_two_nodes
  PROPERTIES TIMEOUT 300)
