# The example end to end: sharded runs give the unsharded run's losses.
set(_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh)
set(_mlp $<TARGET_FILE:train_mlp> --steps 20 --plan ${PROJECT_SOURCE_DIR}/plans/mlp.yaml)
set(_mlp_ref $<TARGET_FILE:train_mlp> --steps 20)
add_test(NAME e2e_mlp_threads_f64 COMMAND ${_e2e} 1e-10 -- ${_mlp_ref} --dtype float64 -- ${_mlp} --dtype float64 --ranks 2)
# float32: within a bound measured from the float32-vs-float64 spread of the
# unsharded run itself (losses_match.sh), so that another CPU's BLAS kernels
# or thread count pass while a wrong gradient does not.
add_test(NAME e2e_mlp_threads4_f32 COMMAND ${_e2e} float32 -- ${_mlp_ref} -- ${_mlp} --ranks 4)
# The same check under OpenBLAS's kernels for other CPUs and other pool sizes
# (what made the fixed 1e-5 tolerance fail on a newcomer's machine). Only the
# kernels this CPU can run: a forced core type is not checked by OpenBLAS.
set(_coretypes Prescott Nehalem)
if(EXISTS /proc/cpuinfo)
  file(STRINGS /proc/cpuinfo _cpu_flags REGEX "^flags" LIMIT_COUNT 1)
  foreach(_pair "avx;Sandybridge" "avx2;Haswell" "avx512f;SkylakeX")
    list(GET _pair 0 _flag)
    list(GET _pair 1 _core)
    if(_cpu_flags MATCHES " ${_flag}( |$)")
      list(APPEND _coretypes ${_core})
    endif()
  endforeach()
endif()
foreach(core ${_coretypes})
  foreach(blas 1 2)
    add_test(NAME e2e_mlp_threads4_f32_${core}_blas${blas}
      COMMAND ${_e2e} float32 -- ${_mlp_ref} -- ${_mlp} --ranks 4)
    set_tests_properties(e2e_mlp_threads4_f32_${core}_blas${blas} PROPERTIES TIMEOUT 300
      ENVIRONMENT "OPENBLAS_CORETYPE=${core};OPENBLAS_NUM_THREADS=${blas}")
  endforeach()
endforeach()
# The check catches a gradient 1% too large (SGD: a learning rate 1% too
# large is the same update), so it is no rubber stamp.
add_test(NAME e2e_mlp_f32_catches_wrong_gradient_scale COMMAND ${_e2e} float32 --expect-mismatch
  -- ${_mlp_ref} --optimizer sgd -- ${_mlp} --ranks 4 --optimizer sgd --lr 0.0101)
add_test(NAME e2e_mlp_gloo_launcher COMMAND ${_e2e} float32 -- ${_mlp_ref}
  -- $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo -- ${_mlp})
# Two launchers as two nodes (ranks of node 1 on 127.0.0.2) form one 4-rank
# gloo job through the TCP store on a free port.
add_test(NAME e2e_mlp_gloo_two_nodes COMMAND ${_e2e} float32 -- ${_mlp_ref}
  -- ${CMAKE_CURRENT_SOURCE_DIR}/e2e/two_nodes_gloo.sh $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:launcher_probe> 2
  -- ${_mlp})
add_test(NAME e2e_mlp_auto_gloo_launcher COMMAND ${_e2e} float32 -- ${_mlp_ref}
  -- $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo -- ${_mlp_ref} --plan auto)
set_tests_properties(e2e_mlp_threads_f64 e2e_mlp_threads4_f32 e2e_mlp_f32_catches_wrong_gradient_scale
  e2e_mlp_gloo_launcher e2e_mlp_gloo_two_nodes e2e_mlp_auto_gloo_launcher PROPERTIES TIMEOUT 300)
# Issue 23: train_mlp checks its options before training too (--steps 0 used
# to end in a division by zero after the empty run, --steps 5x in 5 steps).
add_test(NAME e2e_mlp_option_steps_zero COMMAND train_mlp --steps 0)
add_test(NAME e2e_mlp_option_not_a_number COMMAND train_mlp --steps 5x)
set_tests_properties(e2e_mlp_option_steps_zero PROPERTIES
  PASS_REGULAR_EXPRESSION "^train_mlp: --steps, --batch, --in, --hidden and --out must be at least 1\n")
set_tests_properties(e2e_mlp_option_not_a_number PROPERTIES
  PASS_REGULAR_EXPRESSION "^train_mlp: --steps must be an integer from 0 to 2147483647, got '5x'\n")
set_tests_properties(e2e_mlp_option_steps_zero e2e_mlp_option_not_a_number PROPERTIES
  FAIL_REGULAR_EXPRESSION "step +1 " TIMEOUT 60)
