# The example end to end: sharded runs give the unsharded run's losses.
set(_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh)
set(_mlp $<TARGET_FILE:train_mlp> --steps 20 --plan ${PROJECT_SOURCE_DIR}/plans/mlp.yaml)
set(_mlp_ref $<TARGET_FILE:train_mlp> --steps 20)
add_test(NAME e2e_mlp_threads_f64 COMMAND ${_e2e} 1e-10 -- ${_mlp_ref} --dtype float64 -- ${_mlp} --dtype float64 --ranks 2)
add_test(NAME e2e_mlp_threads4_f32 COMMAND ${_e2e} 1e-5 -- ${_mlp_ref} -- ${_mlp} --ranks 4)
add_test(NAME e2e_mlp_gloo_launcher COMMAND ${_e2e} 1e-5 -- ${_mlp_ref}
  -- $<TARGET_FILE:shardplan> launch -n 2 --backend gloo -- ${_mlp})
add_test(NAME e2e_mlp_gloo_two_nodes COMMAND ${_e2e} 1e-5 -- ${_mlp_ref}
  -- ${CMAKE_CURRENT_SOURCE_DIR}/launcher/two_nodes.sh $<TARGET_FILE:shardplan> 2 0 -- ${_mlp})
set_tests_properties(e2e_mlp_threads_f64 e2e_mlp_threads4_f32 e2e_mlp_gloo_launcher e2e_mlp_gloo_two_nodes
  PROPERTIES TIMEOUT 300)
